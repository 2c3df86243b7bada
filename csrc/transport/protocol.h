#pragma once

namespace tgpg {

// PROTOCOL_VERSION_CURRENT of protos/torch_grpc_pg.proto (wire_format.cc checks).
constexpr unsigned kProtocolVersion = 6;

constexpr const char* kExchangeMethod = "/torch_grpc_pg.ProcessGroupService/Exchange";

}  // namespace tgpg
