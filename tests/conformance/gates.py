"""What the grpc backend declares to PyTorch's distributed suite, and why.

Imported by torch_suite.py before torch's suite (whose skip decorators read
the declarations at import) and by run.py; it imports nothing heavy.
"""

from __future__ import annotations

from typing import NamedTuple

# Sets of DistTestCases.backend_feature that grpc joins, as gloo is in them:
# a plugin backend (registered by importing torch_grpc_pg), DistributedDataParallel,
# subgroups (new_group), and CUDA tensors ("gpu", "cuda": the backend stages
# them through pinned host memory). The suite's CUDA tests still skip on a
# machine without enough GPUs, for gloo as for grpc.
GRPC_FEATURES = ("plugin", "ddp", "subgroup", "gpu", "cuda")


class Ungated(NamedTuple):
    gate: str  # the suite's skip reason, checked before the skip is lifted
    why: str  # why grpc does what the test needs


GET_FUTURE = "get_future is only supported on mpi, nccl and gloo"
GLOO_ONLY = "Test requires backend grpc to be one of {'gloo'}"
COALESCED = Ungated(
    GLOO_ONLY, "all_reduce_coalesced runs every reduce op on tensors of one dtype"
)
NO_SYNC = Ungated(
    GET_FUTURE,
    "DDP's no_sync and comm hooks read the gradients from Work.get_future(), which "
    "holds the output tensors",
)

# Tests that torch's suite skips for every backend not named gloo (or gloo,
# nccl, mpi), which grpc runs: the backend does what each needs. Some of them
# also need a world of 8 or GPUs, and then skip for grpc for that reason, as
# for gloo.
UNGATED: dict[str, Ungated] = {
    "test_get_future": Ungated(
        GET_FUTURE,
        "every Work's get_future() completes with its output tensors, and then() chains",
    ),
    "test_accumulate_gradients_no_sync": NO_SYNC,
    "test_accumulate_gradients_no_sync_allreduce_hook": NO_SYNC,
    "test_accumulate_gradients_no_sync_allreduce_with_then_hook": NO_SYNC,
    "test_accumulate_gradients_no_sync_grad_is_view": NO_SYNC,
    "test_grads_same_across_ranks_with_no_sync": Ungated(
        GLOO_ONLY, "DDP with no_sync over any backend that all-reduces"
    ),
    **{
        f"test_all_reduce_coalesced{group}_{op}": COALESCED
        for group in ("", "_group", "_full_group")
        for op in ("sum", "product", "min", "max")
    },
    "test_scatter_object_list": Ungated(
        GLOO_ONLY, "scatter_object_list runs over broadcast and scatter of CPU tensors"
    ),
    "test_batch_isend_irecv_gloo": Ungated(
        "GLOO Batch Send Recv CPU", "batch_isend_irecv of CPU tensors"
    ),
    "test_batch_isend_irecv_gloo_tags": Ungated(
        "GLOO Batch Send Recv CPU", "batch_isend_irecv of CPU tensors, with tags"
    ),
    **dict.fromkeys(
        (
            "test_barrier_timeout_full_group",
            "test_barrier_timeout_global",
            "test_barrier_timeout_group",
        ),
        Ungated(
            "Only gloo backend supports timeouts",
            "a barrier that a peer never joins fails at the group's timeout",
        ),
    ),
    "test_sparse_all_reduce_sum": Ungated(
        "Only Gloo backend supports sparse all reduce",
        "all_reduce of sparse COO tensors (SUM), summed as gloo sums them",
    ),
    # The CUDA variants of the above: they need GPUs, and without them skip
    # under grpc as under gloo. grpc stages CUDA tensors through pinned host
    # memory; that path has not yet run on a GPU.
    **dict.fromkeys(
        (
            "test_all_reduce_sum_cuda",
            "test_all_reduce_sum_cuda_async",
            "test_all_reduce_sum_cuda_complex",
        ),
        Ungated(
            "Only Gloo and NCCL backends will have CUDA allReduce tested",
            "all_reduce of CUDA tensors",
        ),
    ),
    "test_broadcast_cuda": Ungated(
        "Only Gloo and Nccl backends support CUDA allReduce",
        "broadcast of CUDA tensors",
    ),
    "test_sparse_all_reduce_sum_cuda": Ungated(
        "Only Gloo backend supports sparse all reduce",
        "all_reduce of sparse CUDA tensors, which torch sends to allreduce_sparse",
    ),
    **dict.fromkeys(
        ("test_static_graph_multi_forward", "test_sync_bn_logged"),
        Ungated(
            "Only Nccl & Gloo backend support DistributedDataParallel",
            "DistributedDataParallel on CUDA modules",
        ),
    ),
}

# Ungated tests whose body picks its CPU code path by the backend's name
# (``if BACKEND == "mpi" or BACKEND == "gloo"``) and has none for another
# backend. Their body runs with the suite's BACKEND reading "gloo", once every
# rank has joined the default group over grpc, which the body's DDP model
# then uses (torch_suite.py checks that the group is grpc's).
BODY_READS_GLOO: dict[str, str] = dict.fromkeys(
    (
        "test_accumulate_gradients_no_sync",
        "test_accumulate_gradients_no_sync_allreduce_hook",
        "test_accumulate_gradients_no_sync_allreduce_with_then_hook",
        "test_accumulate_gradients_no_sync_grad_is_view",
    ),
    "_test_accumulate_gradients_no_sync builds its CPU model only for mpi and gloo",
)

# Tests that gloo passes and grpc cannot, each with the reason; run.py
# accepts these, and reports them.
MONITORED_BARRIER = (
    "monitored_barrier: torch's Python raises ValueError for every backend but gloo "
    "(distributed_c10d.monitored_barrier checks the backend's name)"
)
GLOO_ONLY_TESTS: dict[str, str] = dict.fromkeys(
    (
        "test_monitored_barrier_gloo",
        "test_monitored_barrier_gloo_rank_0_timeout",
        "test_monitored_barrier_gloo_subgroup",
        # These two need a world of 8 and skip for gloo too at worlds 2 to 4.
        "test_monitored_barrier_failure_order",
        "test_monitored_barrier_wait_all_ranks",
    ),
    MONITORED_BARRIER,
)
