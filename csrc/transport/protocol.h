#pragma once

namespace tgpg {

// PROTOCOL_VERSION_CURRENT of protos/torch_grpc_pg.proto (wire_format.cc checks).
constexpr unsigned kProtocolVersion = 8;

constexpr const char* kExchangeMethod = "/torch_grpc_pg.ProcessGroupService/Exchange";

// Where the handshake travels (see Hello in protos/torch_grpc_pg.proto): binary
// metadata, which gRPC bounds (kMaxHandshakeMetadataBytes) before any of it
// reaches this code.
constexpr const char* kHelloMetadataKey = "tgpg-hello-bin";
constexpr const char* kWelcomeMetadataKey = "tgpg-welcome-bin";

}  // namespace tgpg
