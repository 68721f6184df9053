//===- CudaCheck.cpp - Error checks, operand checks and scratch of the CUDA backend ===//
//
// Implements CudaCheck.h: error messages that name the backend kernel and the CUDA call, the
// checks only the CUDA kernels make (scalars, in-place safety), per-device launch parameters
// (multiprocessor count, shared-memory limit) cached after the first query, stream-ordered
// scratch memory, and the scratch arena of conditional graph bodies.
//
//===----------------------------------------------------------------------===//

#include "CudaCheck.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>

namespace bonsai::rt::cuda::detail {

void checkCuda(cudaError_t status, const char *call, const char *kernel) {
  if (status != cudaSuccess)
    fail(kernel, std::string(call) + " failed: " + cudaGetErrorName(status) + ": " +
                     cudaGetErrorString(status));
}

void checkLaunch(const char *kernel, const char *deviceKernel) {
  cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    fail(kernel, std::string("launch of ") + deviceKernel + " failed: " +
                     cudaGetErrorName(status) + ": " + cudaGetErrorString(status));
}

void checkScalar(const char *kernel, const char *operand, const TensorView &t) {
  checkFloat(kernel, operand, t);
  if (t.numel() != 1)
    fail(kernel, std::string(operand) + " shape " + formatShape(t.shape) + " is not a scalar");
}

bool safeInPlace(const TensorView &in, const TensorView &out) {
  if (!overlaps(in, out))
    return true;
  return in.data == out.data && dtypeSize(in.dtype) == dtypeSize(out.dtype) &&
         in.numel() == out.numel();
}

bool allDType(DType dtype, std::initializer_list<const TensorView *> tensors) {
  for (const TensorView *t : tensors)
    if (t && t->dtype != dtype)
      return false;
  return true;
}

namespace {

constexpr int kMaxDevices = 64;

int currentDevice(const char *kernel) {
  int device = 0;
  checkCuda(cudaGetDevice(&device), "cudaGetDevice", kernel);
  if (device < 0 || device >= kMaxDevices)
    fail(kernel, "device ordinal " + std::to_string(device) + " is beyond the " +
                     std::to_string(kMaxDevices) + " devices the backend caches");
  return device;
}

/// A device attribute, queried once per device (0 = not yet queried; every cached attribute
/// is positive).
int cachedAttribute(std::array<std::atomic<int>, kMaxDevices> &cache, cudaDeviceAttr attr,
                    const char *name, const char *kernel) {
  int device = currentDevice(kernel);
  int value = cache[size_t(device)].load(std::memory_order_relaxed);
  if (value > 0)
    return value;
  checkCuda(cudaDeviceGetAttribute(&value, attr, device), name, kernel);
  cache[size_t(device)].store(value, std::memory_order_relaxed);
  return value;
}

} // namespace

int multiprocessorCount(const char *kernel) {
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  return cachedAttribute(cache, cudaDevAttrMultiProcessorCount,
                         "cudaDeviceGetAttribute(MultiProcessorCount)", kernel);
}

size_t maxDynamicSharedMemory(const char *kernel) {
  static std::array<std::atomic<int>, kMaxDevices> cache{};
  return size_t(cachedAttribute(cache, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                "cudaDeviceGetAttribute(MaxSharedMemoryPerBlockOptin)", kernel));
}

unsigned gridFor(const char *kernel, int64_t work, int64_t perBlock, int blocksPerSm) {
  int64_t needed = (work + perBlock - 1) / perBlock;
  int64_t cap = int64_t(multiprocessorCount(kernel)) * blocksPerSm;
  return unsigned(std::max<int64_t>(1, std::min(needed, cap)));
}

Scratch::Scratch(const char *kernel, Stream stream, size_t bytes)
    : kernel_(kernel), stream_(stream) {
  if (!bytes)
    return;
  ptr_ = ScratchArena::takeInBody(kernel, bytes);
  fromArena_ = ptr_ != nullptr;
  if (!fromArena_)
    checkCuda(cudaMallocAsync(&ptr_, bytes, stream), "cudaMallocAsync", kernel);
}

Scratch::Scratch(Scratch &&other) noexcept
    : kernel_(other.kernel_), stream_(other.stream_), ptr_(other.ptr_),
      fromArena_(other.fromArena_) {
  other.ptr_ = nullptr;
}

Scratch::~Scratch() {
  if (!ptr_ || fromArena_) // the arena's bytes are given back by the BodyScope
    return;
  // A destructor cannot throw: a failed free is reported, the memory is lost.
  cudaError_t status = cudaFreeAsync(ptr_, stream_);
  if (status != cudaSuccess)
    std::fprintf(stderr, "bonsai: cuda %s: cudaFreeAsync failed: %s: %s\n", kernel_,
                 cudaGetErrorName(status), cudaGetErrorString(status));
}

TensorView copyToScratch(const char *kernel, Stream stream, const TensorView &t,
                         std::vector<Scratch> &keep) {
  keep.emplace_back(kernel, stream, t.bytes());
  TensorView copy = t;
  copy.data = keep.back().get();
  if (t.bytes())
    checkCuda(cudaMemcpyAsync(copy.data, t.data, t.bytes(), cudaMemcpyDeviceToDevice, stream),
              "cudaMemcpyAsync", kernel);
  return copy;
}

TensorView F32Staging::in(const TensorView &t) {
  inputs_.push_back(t);
  if (t.dtype == DType::F32)
    return t;
  keep_.emplace_back(kernel_, stream_, size_t(t.numel()) * sizeof(float));
  TensorView f = t;
  f.dtype = DType::F32;
  f.data = keep_.back().get();
  castOnDevice(kernel_, stream_, t, f);
  return f;
}

TensorView F32Staging::out(const TensorView &t) {
  bool direct = t.dtype == DType::F32;
  for (const TensorView &in : inputs_)
    direct = direct && safeInPlace(in, t);
  if (direct)
    return t;
  keep_.emplace_back(kernel_, stream_, size_t(t.numel()) * sizeof(float));
  TensorView f = t;
  f.dtype = DType::F32;
  f.data = keep_.back().get();
  outputs_.emplace_back(f, t);
  return f;
}

void F32Staging::finish() {
  for (auto &[scratch, destination] : outputs_)
    castOnDevice(kernel_, stream_, scratch, destination);
  outputs_.clear();
}

} // namespace bonsai::rt::cuda::detail

namespace bonsai::rt::cuda {

namespace {
/// The arena lent to this thread (ScratchArena::Lend), if any.
thread_local ScratchArena *lentArena = nullptr;
constexpr size_t kArenaAlignment = 256;
} // namespace

ScratchArena::~ScratchArena() {
  if (data_)
    cudaFree(data_); // a destructor cannot throw; a failed free only loses the memory
}

void ScratchArena::growToNeeded() {
  if (needed_ <= capacity_)
    return;
  if (data_)
    detail::checkCuda(cudaFree(data_), "cudaFree(scratch arena)", "scratch arena");
  data_ = nullptr;
  capacity_ = 0;
  detail::checkCuda(cudaMalloc(&data_, needed_), "cudaMalloc(scratch arena)", "scratch arena");
  capacity_ = needed_;
}

ScratchArena::Lend::Lend(ScratchArena &arena) : previous_(lentArena) { lentArena = &arena; }

ScratchArena::Lend::~Lend() { lentArena = previous_; }

ScratchArena::BodyScope::BodyScope() : arena_(lentArena) {
  if (arena_) {
    begin_ = arena_->used_;
    ++arena_->depth_;
  }
}

ScratchArena::BodyScope::~BodyScope() {
  if (arena_) {
    arena_->used_ = begin_;
    --arena_->depth_;
  }
}

void *ScratchArena::takeInBody(const char *kernel, size_t bytes) {
  ScratchArena *arena = lentArena;
  if (!arena || arena->depth_ == 0)
    return nullptr;
  size_t offset = (arena->used_ + kArenaAlignment - 1) / kArenaAlignment * kArenaAlignment;
  size_t end = offset + bytes;
  arena->needed_ = std::max(arena->needed_, end);
  if (end > arena->capacity_)
    detail::fail(kernel, "scratch of " + std::to_string(bytes) +
                             " bytes in a conditional graph body does not fit the scratch "
                             "arena's " +
                             std::to_string(arena->capacity_) +
                             " bytes (the backend grows it and captures again)");
  arena->used_ = end;
  return static_cast<char *>(arena->data_) + offset;
}

} // namespace bonsai::rt::cuda
