#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <string>
#include <vector>

#include "backend/process_group_grpc.h"

namespace tgpg {

// torch names a process group after its backend's type, and every plugin's
// type is CUSTOM, so pg.name() and DDP's logs would say "custom". This
// ProcessGroup serves the grpc backend on the given devices and says "grpc".
class GrpcProcessGroup : public c10d::ProcessGroup {
 public:
  GrpcProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                   const c10::intrusive_ptr<ProcessGroupGrpc>& backend, const std::vector<std::string>& devices)
      : c10d::ProcessGroup(store, rank, size) {
    setDefaultBackend(BackendType::CUSTOM);
    for (const auto& device : devices) setBackend(c10::Device(device).type(), BackendType::CUSTOM, backend);
  }

  const std::string getBackendName() const override { return "grpc"; }
};

}  // namespace tgpg
