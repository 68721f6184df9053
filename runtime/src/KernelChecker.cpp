//===- KernelChecker.cpp - The rules every plan kernel follows ------------===//
//
// The part of a kernel's verification that is the same for every kind: operand counts and
// names from the kernel table (or, for generated kernels and multi-tensor updates, from their
// own counts), NF4 operands, overlap between outputs and inputs, and the phase an optimizer
// kernel may run in; then the dispatch to the kind's contract (runtime/contract/).
//
//===----------------------------------------------------------------------===//

#include "KernelChecker.h"

namespace bonsai::rt::contract {

void KernelChecker::checkArity() {
  const KernelKindInfo &info = kernelKindInfo(kernel.kind);
  if (kernel.kind == KernelKind::FusedElementwise)
    return checkGeneratedArity(); // its arity is its generated kernel's
  size_t minIn = info.minInputs, minOut = info.minOutputs;
  if (info.has(kernel_traits::kCustomArity)) {
    nameMultiTensorOperands(); // names as many operands as the counts are right for
    minIn = operandNames.size();
    minOut = resultNames.size();
  } else {
    operandNames = info.inputs;
    resultNames = info.outputs;
    variadic = info.has(kernel_traits::kVariadic);
  }
  size_t maxIn = variadic ? std::numeric_limits<size_t>::max() : operandNames.size();
  size_t maxOut = resultNames.size();
  size_t n = kernel.inputs.size();
  if (n < minIn || n > maxIn) {
    std::string expected = variadic ? std::string("1 or more")
                           : minIn == maxIn
                               ? std::to_string(minIn)
                               : std::to_string(minIn) + " or " + std::to_string(maxIn);
    std::string names;
    for (const std::string &name : operandNames)
      names += (names.empty() ? "" : ", ") + name;
    fail("expected " + expected + " inputs" + (names.empty() ? "" : " (" + names + ")") + ", got " +
         std::to_string(n));
  }
  size_t m = kernel.outputs.size();
  if (m < minOut || m > maxOut) {
    std::string expected = minOut == maxOut
                               ? std::to_string(minOut)
                               : std::to_string(minOut) + " or " + std::to_string(maxOut);
    std::string names;
    for (const std::string &name : resultNames)
      names += (names.empty() ? "" : ", ") + name;
    fail("expected " + expected + (maxOut == 1 ? " output" : " outputs") +
         (maxOut == 1 ? "" : " (" + names + ")") + ", got " + std::to_string(m));
  }
  for (size_t i = 0; i < n; ++i)
    if (kernel.inputs[i] >= plan.tensors.size())
      fail("input " + std::to_string(i) + " (" +
           (variadic ? operandNames[0] + std::to_string(i + 1) : operandNames[i]) + ") is tensor " +
           std::to_string(kernel.inputs[i]) + ", but the plan has " +
           std::to_string(plan.tensors.size()) + " tensors");
  for (size_t j = 0; j < m; ++j)
    if (kernel.outputs[j] >= plan.tensors.size())
      fail("output " + std::to_string(j) + " is tensor " + std::to_string(kernel.outputs[j]) +
           ", but the plan has " + std::to_string(plan.tensors.size()) + " tensors");
}

void KernelChecker::nameMultiTensorOperands() {
  std::vector<std::string> shared = multiTensorShared(), lists = multiTensorStates();
  size_t inputs = kernel.inputs.size(), outputs = kernel.outputs.size();
  std::string sharedNames;
  for (const std::string &name : shared)
    sharedNames += name + ", ";
  if (inputs <= shared.size())
    fail("expected " + sharedNames + "and at least one gradient (g1 ..) as inputs, got " +
         std::to_string(inputs) + " inputs");
  size_t n = inputs - shared.size();
  bool masters = outputs == (lists.size() + 1) * n;
  if (outputs != lists.size() * n && !masters) {
    std::string listNames;
    for (const std::string &name : lists)
      listNames += name + "1 .. " + name + std::to_string(n) + ", ";
    fail("expected " + std::to_string(lists.size() * n) + " or " +
         std::to_string((lists.size() + 1) * n) + " outputs (" + listNames + "[master1 .. master" +
         std::to_string(n) + "]) for " + std::to_string(n) + " gradients, got " +
         std::to_string(outputs));
  }
  operandNames = shared;
  for (size_t i = 1; i <= n; ++i)
    operandNames.push_back("g" + std::to_string(i));
  if (masters)
    lists.push_back("master");
  resultNames.clear();
  for (const std::string &list : lists)
    for (size_t i = 1; i <= n; ++i)
      resultNames.push_back(list + std::to_string(i));
}

void KernelChecker::checkGeneratedArity() {
  uint32_t g = kernel.attrsAs<GeneratedKernelAttrs>().kernel;
  if (g >= plan.generatedKernels.size())
    fail("runs generated kernel " + std::to_string(g) + ", but the plan has " +
         std::to_string(plan.generatedKernels.size()) + " generated kernels");
  const GeneratedKernelInfo &generated = plan.generatedKernels[g];
  const ElementwiseProgramInfo &program = generated.program;
  std::string what = "generated kernel " + std::to_string(g) + " '" + generated.name + "'";
  if (kernel.inputs.size() != program.inputs.size() ||
      kernel.outputs.size() != program.outputs.size())
    fail("expected " + std::to_string(program.inputs.size()) + " inputs and " +
         std::to_string(program.outputs.size()) + " outputs (those of " + what + "), got " +
         std::to_string(kernel.inputs.size()) + " and " + std::to_string(kernel.outputs.size()));
  operandNames = {"x"};
  resultNames.clear();
  for (size_t j = 0; j < kernel.outputs.size(); ++j)
    resultNames.push_back("y" + std::to_string(j + 1));
  variadic = true;
  for (size_t i = 0; i < kernel.inputs.size(); ++i)
    if (kernel.inputs[i] >= plan.tensors.size())
      fail("input " + std::to_string(i) + " is tensor " + std::to_string(kernel.inputs[i]) +
           ", but the plan has " + std::to_string(plan.tensors.size()) + " tensors");
  for (size_t j = 0; j < kernel.outputs.size(); ++j)
    if (kernel.outputs[j] >= plan.tensors.size())
      fail("output " + std::to_string(j) + " is tensor " + std::to_string(kernel.outputs[j]) +
           ", but the plan has " + std::to_string(plan.tensors.size()) + " tensors");
  int64_t n = out(0).numel;
  for (size_t j = 0; j < kernel.outputs.size(); ++j) {
    DType want = program.registerType(program.outputs[j]);
    if (out(j).dtype != want)
      fail(outName(j) + " dtype: " + what + " computes " + dtypeName(want) + ", got " +
           dtypeName(out(j).dtype));
    if (out(j).numel != n)
      fail(outName(j) + " has " + std::to_string(out(j).numel) + " elements, " + outName(0) + " " +
           std::to_string(n) + " (the outputs of an elementwise kernel agree)");
  }
  for (size_t i = 0; i < kernel.inputs.size(); ++i) {
    if (in(i).dtype != program.inputs[i])
      fail(inName(i) + " dtype: " + what + " reads " + dtypeName(program.inputs[i]) + ", got " +
           dtypeName(in(i).dtype));
    if (in(i).numel < 1 || n % in(i).numel != 0)
      fail(inName(i) + " has " + std::to_string(in(i).numel) +
           " elements, which do not divide the outputs' " + std::to_string(n) +
           " (an input is read at the element index modulo its size)");
  }
}

void KernelChecker::checkOverlap() const {
  for (size_t j = 0; j < kernel.outputs.size(); ++j) {
    for (size_t k = j + 1; k < kernel.outputs.size(); ++k)
      if (rangesOverlap(out(j), out(k)))
        fail(outName(k) + " overlaps " + outName(j) + " in arena " + std::to_string(out(j).arena) +
             " (the outputs of a kernel are distinct tensors)");
    for (size_t i = 0; i < kernel.inputs.size(); ++i) {
      if (!rangesOverlap(in(i), out(j)))
        continue;
      if (kernelKindInfo(kernel.kind).has(kernel_traits::kInPlace) && sameStorage(in(i), out(j)))
        continue;
      // Element k of an output depends on element k of a full-size input only: a broadcast
      // input is read at other positions after they are written.
      if (kernel.kind == KernelKind::FusedElementwise && sameStorage(in(i), out(j)) &&
          in(i).numel == out(j).numel)
        continue;
      fail(outName(j) + " overlaps " + inName(i) + " in arena " + std::to_string(out(j).arena) +
           (kernelKindInfo(kernel.kind).has(kernel_traits::kInPlace)
                ? " (only an exact alias is allowed for this kind)"
                : " (this kind cannot run in place)"));
    }
  }
}

void KernelChecker::checkPhase() const {
  const KernelKindInfo &info = kernelKindInfo(kernel.kind);
  if (info.has(kernel_traits::kUpdateOnly) && kernel.phase != Phase::Update &&
      !(kernel.phase == Phase::Backward && info.has(kernel_traits::kMayRunInBackward)))
    fail(std::string("runs in the ") + phaseName(kernel.phase) +
         " phase, but optimizer kernels run once per step, in the update phase (or, for "
         "updates applied as gradients complete, in the backward pass)");
}

void KernelChecker::checkSpaces() const {
  if (kernelKindInfo(kernel.kind).has(kernel_traits::kCrossesSpaces))
    return;
  // A kernel on the host stream runs on the CPU: it cannot reach device memory.
  bool onHost = kernel.stream == StreamId::Host;
  // A GPU kernel reading pinned host memory would run (CUDA maps it) at PCIe speed, or not at
  // all on a backend that does not map it: the plan moves it with the copy kinds instead.
  auto check = [&](const TensorInfo &t, const std::string &name) {
    bool pinned = arenaOf(t).space == MemorySpace::PinnedHost;
    if (onHost && !pinned)
      fail(name + " is in device arena '" + arenaOf(t).name +
           "': a kernel on the host stream reads and writes pinned host memory only (the plan "
           "copies its operands there)");
    if (!onHost && pinned)
      fail(name + " is in pinned host arena '" + arenaOf(t).name +
           "': only the host-offload copies (CopyHostToDevice, CopyDeviceToHost) and the "
           "kernels on the host stream read or write pinned host memory");
  };
  for (size_t i = 0; i < kernel.inputs.size(); ++i)
    check(in(i), inName(i));
  for (size_t j = 0; j < kernel.outputs.size(); ++j)
    check(out(j), outName(j));
}

void KernelChecker::checkStream() const {
  const KernelKindInfo &info = kernelKindInfo(kernel.kind);
  if (kernel.stream == StreamId::Host) {
    if (!info.has(kernel_traits::kHostStep))
      fail("runs on the host stream, but only the optimizer updates with a host implementation "
           "(AdamWUpdate, SGDUpdate) run there");
    return;
  }
  if (kernel.stream == StreamId::Collectives) {
    if (!info.has(kernel_traits::kCollective))
      fail("runs on the collectives stream, but only the exchanges with other ranks "
           "(ReduceScatter, AllGather, AllReduce) run there");
    return;
  }
  if (kernel.stream == StreamId::Compute || info.has(kernel_traits::kCrossesSpaces))
    return;
  // Every other kind may share what the backend keeps per compute stream (the GEMM
  // workspace, the kernels' scratch): two of them at once would race on it.
  fail(std::string("runs on the ") + streamName(kernel.stream) +
       " stream, but only the host-offload copies (CopyHostToDevice, CopyDeviceToHost) run on a "
       "copy stream");
}

void KernelChecker::check() {
  checkArity();
  checkNf4Operands();
  checkStream();
  checkSpaces();
  // The kind's contract: one `verify` per kind of the table, in table order.
  using Contract = void (*)(KernelChecker &);
  static const Contract contracts[] = {
#define BONSAI_KERNEL_KIND(Name, ...) [](KernelChecker &c) { c.verify(kinds::Name{}); },
#include "bonsai/runtime/KernelKinds.def"
  };
  static_assert(sizeof contracts / sizeof contracts[0] == kKernelKindCount);
  contracts[kernelKindIndex(kernel.kind)](*this);
  checkOverlap();
  checkPhase();
}

} // namespace bonsai::rt::contract
