#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

namespace tgpg {

// Keeps the tensors a collective sends from alive until the transport lets go of them.
std::shared_ptr<void> keep_alive(std::vector<at::Tensor> tensors);

// Checks made at the call, before anything is sent; each raises a c10::Error
// that starts with `where` ("allreduce on rank 3").
void check_dense(const at::Tensor& t, const std::string& where);
// For a tensor the op writes: dense, and each element in memory of its own.
// Results written into an expanded view would land on one another, and torch
// refuses such a copy only once the op has run, failing the group.
void check_output(const at::Tensor& t, const std::string& where);
// `t` has `expected`'s dtype; check_same_kind, its number of elements too.
void check_same_dtype(const at::Tensor& expected, const at::Tensor& t, const std::string& where,
                      const char* what);
void check_same_kind(const at::Tensor& expected, const at::Tensor& t, const std::string& where,
                     const char* what);

// Copies `src` into `dst` under a guard for dst's device, from the worker thread.
void copy_into(at::Tensor& dst, const at::Tensor& src);

}  // namespace tgpg
