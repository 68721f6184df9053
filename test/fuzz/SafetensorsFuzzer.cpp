//===- SafetensorsFuzzer.cpp - libFuzzer target: safetensors files --------===//
//
// Writes each input as a .safetensors file and opens it as bonsai-run --weights does
// (Checkpoint::open: the 8-byte length, the JSON header, every tensor's dtype, shape and byte
// range), then reads every tensor the runtime has a dtype for, as its own dtype and, for float
// tensors, converted to f32 as a bf16 checkpoint is bound to an f32 plan. Any input must end in
// tensors or an rt::Error; anything else is a bug.
//
//===----------------------------------------------------------------------===//

#include "FuzzFiles.h"

#include "bonsai/runtime/Safetensors.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <vector>

namespace {

using namespace bonsai::rt;

void readAs(const Checkpoint &checkpoint, const SafetensorsEntry &entry, DType dtype) {
  // Sized from the validated element count: the header bounds it by the file's size.
  std::vector<uint8_t> buffer(size_t(entry.numel) * dtypeSize(dtype));
  TensorView view;
  view.data = buffer.data();
  view.dtype = dtype;
  view.shape = entry.shape;
  checkpoint.read(entry, view);
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string path = bonsai::fuzz::writeScratchFile("model.safetensors", data, size);
  try {
    Checkpoint checkpoint = Checkpoint::open(path);
    for (const SafetensorsEntry &entry : checkpoint.tensors()) {
      if (!entry.runtimeDType)
        continue;
      readAs(checkpoint, entry, *entry.runtimeDType);
      if (isComputeFloat(*entry.runtimeDType))
        readAs(checkpoint, entry, DType::F32);
    }
  } catch (const Error &) {
  }
  return 0;
}
