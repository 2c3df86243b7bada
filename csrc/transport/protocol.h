#pragma once

namespace tgpg {

// Must match PROTOCOL_VERSION_CURRENT in protos/torch_grpc_pg.proto.
constexpr unsigned kProtocolVersion = 4;

constexpr const char* kExchangeMethod = "/torch_grpc_pg.ProcessGroupService/Exchange";

}  // namespace tgpg
