#pragma once

namespace tgpg {

// Must match PROTOCOL_VERSION_CURRENT in protos/torch_grpc_pg.proto.
constexpr unsigned kProtocolVersion = 1;

// Client metadata on every Exchange stream: which group and rank it carries
// frames for, and the shared secret.
constexpr const char* kGroupKeyMetadata = "tgpg-group";
constexpr const char* kSrcRankMetadata = "tgpg-src";
constexpr const char* kTokenMetadata = "tgpg-token";

constexpr const char* kExchangeMethod = "/torch_grpc_pg.ProcessGroupService/Exchange";

}  // namespace tgpg
