#pragma once

#include <grpcpp/channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <memory>
#include <optional>
#include <string>

#include "transport/call_peer.h"
#include "transport/transport_config.h"

namespace tgpg {

// Linux bounds the bytes in flight on a unix stream socket by its sender's
// SO_SNDBUF, 208 KiB by default: a 2 MiB chunk then crosses in ten rounds of
// waking the reader and the writer. gRPC has no public way to set a socket
// option, so for a peer on this host the rank connects the socket itself, with
// a send buffer of a chunk, and hands it to gRPC. The unix socket carries no
// TLS (see UnixListener): only the rank's own user can reach it.

// A channel over a new connection to `target` ("unix:<path>"). Returns null and
// sets `retryable_error` while nothing listens there yet; throws
// std::runtime_error on any other failure, a listener of another user among
// them. `peer`, if given, receives the process at the other end.
std::shared_ptr<grpc::Channel> dial_unix_socket(const std::string& target, const TransportConfig& config,
                                                const grpc::ChannelArguments& args, std::string* retryable_error,
                                                std::optional<PeerProcess>* peer = nullptr);

}  // namespace tgpg
