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
grpc::ChannelArguments channel_arguments(const TransportConfig& config);
void apply_server_options(grpc::ServerBuilder& builder);

std::shared_ptr<grpc::ServerCredentials> server_credentials(const TransportConfig& config);
std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TransportConfig& config);

}  // namespace tgpg
