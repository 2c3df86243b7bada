#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace tgpg {

// Settings of the gRPC transport. The Python package fills them from
// torch_grpc_pg.Options and TORCH_GRPC_PG_* environment variables (docs/options.md).
struct TransportConfig {
  std::string bind_host = "0.0.0.0";  // where the server listens
  int port = 0;                       // 0: an ephemeral port
  std::string advertise_host;         // what peers dial; empty: this host's name
  bool unix_sockets = true;           // dial peers on the same host over a unix socket
  std::string auth_token;             // peers must present the same token
  std::string tls_cert_file;          // PEM; enables TLS with tls_key_file
  std::string tls_key_file;
  std::string tls_ca_file;            // PEM; verifies peers, and with TLS on both sides, mutual TLS
  std::string tls_server_name;        // name expected in peers' certificates; empty: the dialled host
  size_t max_queued_frames = 8;       // received frames held per peer before reading pauses
  size_t max_payload_bytes = 2 << 20; // the largest payload of one frame: the group's chunk_bytes
  std::string group_settings;         // what all ranks of the group must share; checked in every handshake
  std::chrono::milliseconds connect_timeout{60000};
  size_t flight_recorder_size = 64;   // ops each group remembers for observers
  std::string flight_recorder_dir;    // where a failed group writes its record; empty: nowhere
  bool health_public = false;         // serve grpc.health.v1 to callers that have not authenticated
  bool tune_malloc = true;            // keep_freed_memory_for_reuse() when the server starts
  bool shared_memory = true;          // chunks to and from peers on this host through a shared ring
  bool encrypt = true;                // with a token, encrypt frames on TCP links (else authenticate only)
  int connections_per_peer = 1;       // TCP connections a group's collectives spread over to each peer

  bool tls_enabled() const { return !tls_cert_file.empty() || !tls_ca_file.empty(); }

  // What every rank of a group must share, as its handshakes check it: the
  // group's own settings, and whether the ranks speak TLS. Links on one host
  // carry no TLS, so without this a rank that lacks the TLS settings would
  // join its neighbours and fail only on its first link to another host.
  std::string shared_settings() const {
    return group_settings + (group_settings.empty() ? "" : " ") + "tls=" + (tls_enabled() ? "on" : "off");
  }
};

}  // namespace tgpg
