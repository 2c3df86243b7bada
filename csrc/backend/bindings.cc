// The Python module torch_grpc_pg._C: one factory that torch_grpc_pg's
// registration calls for every new process group.
#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include "backend/grpc_process_group.h"
#include "backend/process_group_grpc.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  // Registers c10d::Backend and c10d::Store with pybind11 before they are used here.
  py::module_::import("torch.distributed");

  m.def(
      "running_server_settings",
      []() -> py::object {
        const auto config = tgpg::running_server_config();
        if (!config) return py::none();
        py::dict d;
        d["bind_host"] = config->bind_host;
        d["port"] = config->port;
        d["unix_sockets"] = config->unix_sockets;
        d["auth_token"] = config->auth_token;
        d["tls_cert"] = config->tls_cert_file;
        d["tls_key"] = config->tls_key_file;
        d["tls_ca"] = config->tls_ca_file;
        d["tls_server_name"] = config->tls_server_name;
        d["health_public"] = config->health_public;
        d["shared_memory"] = config->shared_memory;
        d["encrypt"] = config->encrypt;
        return d;
      },
      "The security and listening settings of this process's running server, or None: later "
      "process groups inherit them.");

  py::class_<tgpg::ProcessGroupGrpc, c10d::Backend, c10::intrusive_ptr<tgpg::ProcessGroupGrpc>>(
      m, "ProcessGroupGrpc", "The grpc backend of one process group on this rank.")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, const std::string& group_name,
                       const std::string& bind_host, int port, const std::string& advertise_host,
                       bool unix_sockets, const std::string& auth_token, const std::string& tls_cert,
                       const std::string& tls_key, const std::string& tls_ca,
                       const std::string& tls_server_name, size_t chunk_bytes, size_t direct_max_bytes,
                       size_t max_queued_frames, std::chrono::milliseconds connect_timeout,
                       size_t flight_recorder_size, const std::string& flight_recorder_dir, bool health_public,
                       bool tune_malloc, bool shared_memory, bool encrypt, const std::string& wire_dtype,
                       bool two_level, int connections_per_peer) {
             tgpg::BackendOptions options;
             options.timeout = timeout;
             options.group_name = group_name;
             options.chunk_bytes = chunk_bytes;
             options.direct_max_bytes = direct_max_bytes;
             options.two_level = two_level;
             // torch_grpc_pg/options.py has checked the name.
             if (wire_dtype == "bfloat16") options.wire_dtype = tgpg::DType::BFloat16;
             else if (wire_dtype == "float16") options.wire_dtype = tgpg::DType::Float16;
             else if (wire_dtype != "float32") throw std::invalid_argument("grpc backend: wire_dtype=" + wire_dtype +
                                                                           " is not float32, bfloat16 or float16");
             options.transport.bind_host = bind_host;
             options.transport.port = port;
             options.transport.advertise_host = advertise_host;
             options.transport.unix_sockets = unix_sockets;
             options.transport.auth_token = auth_token;
             options.transport.tls_cert_file = tls_cert;
             options.transport.tls_key_file = tls_key;
             options.transport.tls_ca_file = tls_ca;
             options.transport.tls_server_name = tls_server_name;
             options.transport.max_queued_frames = max_queued_frames;
             options.transport.max_payload_bytes = chunk_bytes;
             // Keep in step with torch_grpc_pg/wire.py's group_settings().
             options.transport.group_settings = "chunk_bytes=" + std::to_string(chunk_bytes) +
                                                " direct_max_bytes=" + std::to_string(direct_max_bytes) +
                                                " wire_dtype=" + wire_dtype +
                                                " two_level=" + (two_level ? "on" : "off") +
                                                " connections_per_peer=" + std::to_string(connections_per_peer);
             options.transport.flight_recorder_size = flight_recorder_size;
             options.transport.flight_recorder_dir = flight_recorder_dir;
             options.transport.health_public = health_public;
             options.transport.tune_malloc = tune_malloc;
             options.transport.shared_memory = shared_memory;
             options.transport.encrypt = encrypt;
             options.transport.connect_timeout = connect_timeout;
             options.transport.connections_per_peer = connections_per_peer;
             return c10::make_intrusive<tgpg::ProcessGroupGrpc>(store, rank, size, std::move(options));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_name"),
           py::arg("bind_host"), py::arg("port"), py::arg("advertise_host"), py::arg("unix_sockets"),
           py::arg("auth_token"), py::arg("tls_cert"), py::arg("tls_key"), py::arg("tls_ca"),
           py::arg("tls_server_name"), py::arg("chunk_bytes"), py::arg("direct_max_bytes"),
           py::arg("max_queued_frames"), py::arg("connect_timeout"), py::arg("flight_recorder_size"),
           py::arg("flight_recorder_dir"), py::arg("health_public"), py::arg("tune_malloc"),
           py::arg("shared_memory"), py::arg("encrypt"), py::arg("wire_dtype"),
           py::arg("two_level"), py::arg("connections_per_peer"),
           // Rendezvous waits on the store and on peers; other Python threads run meanwhile.
           py::call_guard<py::gil_scoped_release>())
      .def_property_readonly("tcp_address", &tgpg::ProcessGroupGrpc::tcp_address,
                             "host:port where peers reach this rank's server")
      .def_property_readonly("group_key", &tgpg::ProcessGroupGrpc::group_key,
                             "the key that names this group instance in link handshakes (not a secret)")
      .def_property_readonly("unix_socket", &tgpg::ProcessGroupGrpc::unix_socket,
                             "path of the unix socket peers on this host use, or '' when off")
      .def_property_readonly("failure", &tgpg::ProcessGroupGrpc::failure,
                             "why the group failed (a peer's death or abort, a timeout, abort()), or ''");

  py::class_<tgpg::GrpcProcessGroup, c10d::ProcessGroup, c10::intrusive_ptr<tgpg::GrpcProcessGroup>>(
      m, "GrpcProcessGroup", "A process group whose every device runs the grpc backend; its name() is 'grpc'.")
      .def(py::init<const c10::intrusive_ptr<c10d::Store>&, int, int, const c10::intrusive_ptr<tgpg::ProcessGroupGrpc>&,
                    const std::vector<std::string>&>(),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("backend"), py::arg("devices"));
}
