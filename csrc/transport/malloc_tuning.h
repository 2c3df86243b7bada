#pragma once

namespace tgpg {

// gRPC reads every message into buffers that it mallocs per read and frees
// once the message is consumed: megabytes per chunk, many times a second.
// glibc returns such memory to the kernel (trimming the heap, or unmapping
// blocks above its mmap threshold) and takes it back page by page on the
// next read, which cost a third of a large allreduce's time on a 2-vCPU
// machine. This fixes glibc's two thresholds at the values its own dynamic
// adjustment reaches at most (mmap 32 MiB, trim 64 MiB), so freed buffers are
// reused. It does nothing where the user configured malloc through
// MALLOC_*_ variables or GLIBC_TUNABLES, or under another libc. Once per
// process.
void keep_freed_memory_for_reuse();

}  // namespace tgpg
