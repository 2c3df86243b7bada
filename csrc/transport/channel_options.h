#pragma once

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>

#include "transport/transport_config.h"

namespace tgpg {

// gRPC's defaults suit many small RPCs; collectives stream large messages
// between two fixed peers, so both sides lift the message size limit, widen the
// HTTP/2 windows and read from sockets in large chunks.
// The HTTP/2 window each stream may fill ahead of the reader.
constexpr size_t kStreamWindowBytes = 16 << 20;

grpc::ChannelArguments channel_arguments(const TransportConfig& config);
// `max_message_bytes` bounds every message the server accepts, before any
// peer has authenticated: one frame header and one chunk.
void apply_server_options(grpc::ServerBuilder& builder, size_t max_message_bytes);

std::shared_ptr<grpc::ServerCredentials> server_credentials(const TransportConfig& config);
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TransportConfig& config);

}  // namespace tgpg
