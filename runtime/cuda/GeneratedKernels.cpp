//===- GeneratedKernels.cpp - Load and launch the plan's generated PTX ----===//
//
// The compiler embeds one PTX module per generated kernel in a plan for a GPU (schema
// GeneratedKernel). They are loaded with the runtime API's library management
// (cudaLibraryLoadData, which JIT-compiles PTX for the current device; no driver-API link), once
// per plan, before any phase is captured: loading inside a CUDA Graph capture is not allowed,
// launching is. A plan compiled for the CPU has programs and no PTX: its kernels run on the
// device interpreter (ElementwiseInterpreter.cu), their programs uploaded here once.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/CudaKernels.h"

#include "CudaCheck.h"
#include "ElementwiseInterpreter.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace bonsai::rt::cuda {

using namespace detail;

namespace {
/// Threads per block (unless a kernel allows fewer): a multiple of the warp size that keeps
/// every SM busy for a memory-bound loop.
constexpr unsigned kBlock = 256;
/// Grid-stride loops need no more blocks than fill the device a few times over.
constexpr unsigned kBlocksPerSM = 8;
} // namespace

struct GeneratedKernels::Impl {
  std::vector<cudaLibrary_t> libraries;
  /// Per kernel: its loaded PTX entry, or null when it runs on the interpreter.
  std::vector<cudaKernel_t> kernels;
  /// Per kernel: its program in device memory (interpreted kernels), else null.
  std::vector<DeviceInstruction *> programs;
  /// Per kernel: its program (the interpreter's operand counts).
  std::vector<ElementwiseProgramInfo> infos;
  std::vector<std::string> names;
  std::vector<unsigned> blockSizes; ///< Threads per block of each kernel.
  unsigned maxBlocks = 0;

  // Here rather than in ~GeneratedKernels, so that a constructor that throws half-way still
  // unloads what it loaded.
  ~Impl() {
    for (cudaLibrary_t library : libraries)
      cudaLibraryUnload(library);
    for (DeviceInstruction *program : programs)
      if (program)
        cudaFree(program);
  }

  /// Uploads `program` for the device interpreter; fails naming the kernel when it exceeds
  /// the interpreter's limits.
  void addInterpreted(const GeneratedKernelInfo &info) {
    const char *k = "fused_elementwise";
    const ElementwiseProgramInfo &p = info.program;
    size_t registers = p.inputs.size() + p.instructions.size();
    if (p.inputs.size() > size_t(kMaxInterpretedInputs) ||
        p.outputs.size() > size_t(kMaxInterpretedOutputs) ||
        registers > size_t(kMaxInterpretedRegisters))
      fail(k, "generated kernel '" + info.name + "' has no PTX (the plan was compiled for " +
                  "the CPU) and its program (" + std::to_string(p.inputs.size()) +
                  " inputs, " + std::to_string(p.outputs.size()) + " outputs, " +
                  std::to_string(registers) + " values) exceeds the device interpreter's " +
                  std::to_string(kMaxInterpretedInputs) + ", " +
                  std::to_string(kMaxInterpretedOutputs) + " and " +
                  std::to_string(kMaxInterpretedRegisters) +
                  ": recompile the plan for the GPU (--target=sm_XX)");
    std::vector<DeviceInstruction> code;
    for (const ElementwiseInstruction &inst : p.instructions)
      code.push_back({uint8_t(inst.opcode), uint8_t(inst.type), inst.a, inst.b, inst.imm});
    DeviceInstruction *device = nullptr;
    size_t bytes = std::max<size_t>(code.size(), 1) * sizeof(DeviceInstruction);
    checkCuda(cudaMalloc(&device, bytes), "cudaMalloc(program)", k);
    programs.push_back(device);
    if (!code.empty())
      checkCuda(cudaMemcpy(device, code.data(), code.size() * sizeof(DeviceInstruction),
                           cudaMemcpyHostToDevice),
                "cudaMemcpy(program)", k);
    kernels.push_back(nullptr);
    infos.push_back(p);
    names.push_back(info.name);
    blockSizes.push_back(0);
  }
};

GeneratedKernels::GeneratedKernels(const std::vector<GeneratedKernelInfo> &kernels)
    : impl_(std::make_unique<Impl>()) {
  const char *k = "fused_elementwise";
  int device = 0, sms = 0;
  checkCuda(cudaGetDevice(&device), "cudaGetDevice", k);
  checkCuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
            "cudaDeviceGetAttribute", k);
  impl_->maxBlocks = unsigned(std::max(sms, 1)) * kBlocksPerSM;
  for (const GeneratedKernelInfo &info : kernels) {
    if (info.ptx.empty()) {
      impl_->addInterpreted(info);
      continue;
    }
    // The JIT's error log names the PTX line it rejects.
    char log[4096] = {};
    cudaJitOption options[] = {cudaJitErrorLogBuffer, cudaJitErrorLogBufferSizeBytes};
    void *values[] = {log, reinterpret_cast<void *>(uintptr_t(sizeof log))};
    auto rejected = [&](cudaError_t status, const char *call) {
      cudaGetLastError();
      fail(k, "the driver rejects the PTX of generated kernel '" + info.name + "' (" +
                  info.arch + "): " + call + ": " + cudaGetErrorName(status) + ": " +
                  cudaGetErrorString(status) + (log[0] ? std::string(": ") + log : ""));
    };
    cudaLibrary_t library = nullptr;
    cudaError_t status = cudaLibraryLoadData(&library, info.ptx.c_str(), options, values, 2,
                                             nullptr, nullptr, 0);
    if (status != cudaSuccess)
      rejected(status, "cudaLibraryLoadData");
    impl_->libraries.push_back(library);
    cudaKernel_t kernel = nullptr;
    status = cudaLibraryGetKernel(&kernel, library, info.name.c_str());
    if (status != cudaSuccess)
      rejected(status, "cudaLibraryGetKernel");
    // Asking for the attributes loads the kernel into the current context now: with lazy
    // module loading it would otherwise load at its first launch, which may be inside a
    // CUDA Graph capture. The block size must also fit what the compiled kernel allows.
    cudaFuncAttributes attributes{};
    status = cudaFuncGetAttributes(&attributes, reinterpret_cast<const void *>(kernel));
    if (status != cudaSuccess)
      rejected(status, "cudaFuncGetAttributes");
    impl_->kernels.push_back(kernel);
    impl_->programs.push_back(nullptr);
    impl_->infos.push_back(info.program);
    impl_->names.push_back(info.name);
    impl_->blockSizes.push_back(
        unsigned(std::min<int>(int(kBlock), std::max(attributes.maxThreadsPerBlock, 32))) /
        32 * 32);
  }
}

GeneratedKernels::~GeneratedKernels() = default;

void GeneratedKernels::launch(const Context &ctx, size_t index,
                              const std::vector<const TensorView *> &inputs,
                              const std::vector<const TensorView *> &outputs) const {
  const char *k = "fused_elementwise";
  if (index >= impl_->kernels.size())
    fail(k, "generated kernel " + std::to_string(index) + " is not loaded (" +
                std::to_string(impl_->kernels.size()) + " are)");
  if (outputs.empty())
    fail(k, "no outputs");
  // The PTX's parameters: a pointer per input, a pointer per output, the element count.
  int64_t n = outputs[0]->numel();
  std::vector<void *> pointers;
  for (const TensorView *t : inputs) {
    checkFloat(k, "input", *t);
    if (t->numel() < 1 || n % t->numel() != 0)
      fail(k, "an input of " + std::to_string(t->numel()) +
                  " elements does not divide the outputs' " + std::to_string(n));
    pointers.push_back(t->data);
  }
  for (const TensorView *t : outputs) {
    checkFloat(k, "output", *t);
    if (t->numel() != n)
      fail(k, "outputs of " + std::to_string(t->numel()) + " and " + std::to_string(n) +
                  " elements");
    pointers.push_back(t->data);
  }
  if (n == 0)
    return;
  if (DeviceInstruction *program = impl_->programs[index]) {
    const ElementwiseProgramInfo &p = impl_->infos[index];
    if (inputs.size() != p.inputs.size() || outputs.size() != p.outputs.size())
      fail(k, "kernel '" + impl_->names[index] + "' has " + std::to_string(p.inputs.size()) +
                  " inputs and " + std::to_string(p.outputs.size()) + " outputs, the launch " +
                  std::to_string(inputs.size()) + " and " + std::to_string(outputs.size()));
    InterpreterOperands operands{};
    for (size_t i = 0; i < inputs.size(); ++i) {
      operands.inputs[i] = inputs[i]->data;
      operands.inputNumel[i] = inputs[i]->numel();
      operands.inputTypes[i] = inputs[i]->dtype;
    }
    for (size_t j = 0; j < outputs.size(); ++j) {
      operands.outputs[j] = outputs[j]->data;
      operands.outputTypes[j] = outputs[j]->dtype;
      operands.outputRegisters[j] = p.outputs[j];
    }
    operands.numInputs = int(inputs.size());
    operands.numOutputs = int(outputs.size());
    operands.numInstructions = int(p.instructions.size());
    launchInterpreter(operands, program, n, int(impl_->maxBlocks), ctx.stream);
    return;
  }
  std::vector<void *> args;
  for (void *&p : pointers)
    args.push_back(&p);
  args.push_back(&n);
  unsigned block = impl_->blockSizes[index];
  unsigned blocks =
      unsigned(std::min<int64_t>((n + block - 1) / block, int64_t(impl_->maxBlocks)));
  checkCuda(cudaLaunchKernel(reinterpret_cast<const void *>(impl_->kernels[index]),
                             dim3(blocks), dim3(block), args.data(), 0, ctx.stream),
            "cudaLaunchKernel", k);
  checkLaunch(k, impl_->names[index].c_str());
}

} // namespace bonsai::rt::cuda
