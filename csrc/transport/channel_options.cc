#include "transport/channel_options.h"

#include <grpc/grpc.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace tgpg {
namespace {

// gRPC reads a socket into buffers of a target size that it doubles while
// reads fill them, up to the most, and lets drift down while they do not. A
// new connection starts at the least: a group opens 2 (W - 1) of them, whose
// handshakes each fill a few hundred bytes, and a first buffer of the most
// made `new_group` at world 4 about 8% slower for nothing (64 MiB and 1 MiB
// allreduces over TCP ran the same either way).
constexpr int kMinReadChunkBytes = 256 << 10;
constexpr int kMaxReadChunkBytes = 4 << 20;
constexpr int kMaxFrameBytes = (1 << 24) - 1;  // the largest HTTP/2 allows

// A server only ever sends its two handshake replies.
constexpr int kMaxReplyBytes = 64 << 10;

template <typename Setter>
void set_common_arguments(Setter&& set) {
  set(GRPC_ARG_MAX_SEND_MESSAGE_LENGTH, -1);
  set(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, static_cast<int>(kStreamWindowBytes));
  set(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kMaxFrameBytes);
  set(GRPC_ARG_HTTP2_BDP_PROBE, 1);
  set(GRPC_ARG_TCP_READ_CHUNK_SIZE, kMinReadChunkBytes);
  set(GRPC_ARG_TCP_MIN_READ_CHUNK_SIZE, kMinReadChunkBytes);
  set(GRPC_ARG_TCP_MAX_READ_CHUNK_SIZE, kMaxReadChunkBytes);
  // A peer that vanishes without closing its socket (a host that lost power)
  // is noticed by keepalive pings instead of waiting for the op timeout alone.
  set(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
  set(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
  set(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  set(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) {
    throw std::runtime_error(std::string("cannot read the ") + what + " file '" + path +
                             "'; check the path given in the TLS options");
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

}  // namespace

grpc::ChannelArguments channel_arguments(const TransportConfig& config) {
  grpc::ChannelArguments args;
  set_common_arguments([&](const char* key, int value) { args.SetInt(key, value); });
  args.SetInt(GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH, kMaxReplyBytes);
  // Every link gets its own TCP connection, so that process groups and peers do
  // not share one connection's flow-control window.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  if (config.tls_enabled() && !config.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(config.tls_server_name);
  }
  return args;
}

void apply_server_options(grpc::ServerBuilder& builder, size_t max_message_bytes) {
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<size_t>(max_message_bytes, INT32_MAX)));
  builder.SetMaxSendMessageSize(-1);
  set_common_arguments([&](const char* key, int value) { builder.AddChannelArgument(key, value); });
  // Two servers on one fixed port would split its connections between them.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
}

std::shared_ptr<grpc::ServerCredentials> server_credentials(const TransportConfig& config) {
  if (!config.tls_enabled()) return grpc::InsecureServerCredentials();
  if (config.tls_cert_file.empty() || config.tls_key_file.empty()) {
    throw std::runtime_error(
        "TLS needs both a certificate and a key: set TORCH_GRPC_PG_TLS_CERT and TORCH_GRPC_PG_TLS_KEY");
  }
  grpc::SslServerCredentialsOptions options(
      config.tls_ca_file.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                 : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  if (!config.tls_ca_file.empty()) options.pem_root_certs = read_file(config.tls_ca_file, "TLS CA");
  options.pem_key_cert_pairs.push_back(
      {read_file(config.tls_key_file, "TLS key"), read_file(config.tls_cert_file, "TLS certificate")});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> channel_credentials(const TransportConfig& config) {
  if (!config.tls_enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  if (!config.tls_ca_file.empty()) options.pem_root_certs = read_file(config.tls_ca_file, "TLS CA");
  if (!config.tls_cert_file.empty()) {
    options.pem_private_key = read_file(config.tls_key_file, "TLS key");
    options.pem_cert_chain = read_file(config.tls_cert_file, "TLS certificate");
  }
  return grpc::SslCredentials(options);
}

}  // namespace tgpg
