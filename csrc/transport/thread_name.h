#pragma once

#include <pthread.h>

namespace tgpg {

// Names the calling thread as top -H, gdb and py-spy show it, so that the
// threads of a stuck rank say whose they are. Linux keeps 15 characters.
inline void name_this_thread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace tgpg
