//===- SafetensorsIndexFuzzer.cpp - libFuzzer target: sharded checkpoints -===//
//
// Writes each input as model.safetensors.index.json beside two valid shards (written once, at
// start-up) and opens it as bonsai-run --weights DIR does: the index's JSON, its weight_map
// and metadata, each shard it names and the tensors it places in them; then reads every tensor
// found. Any input must end in tensors or an rt::Error; anything else is a bug.
//
//===----------------------------------------------------------------------===//

#include "FuzzFiles.h"

#include "bonsai/runtime/Safetensors.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <vector>

using namespace bonsai::rt;

/// The shards every input's weight_map can name (the seed corpus's index names them).
extern "C" int LLVMFuzzerInitialize(int *, char ***) {
  const std::string &dir = bonsai::fuzz::scratchDir();
  std::vector<float> values = {1.0f, -2.0f, 0.5f, 3.0f, -0.25f, 8.0f};
  std::vector<uint16_t> halves = {0x3f80, 0xc000, 0x3f00, 0x4040};
  writeSafetensors(dir + "/model-00001-of-00002.safetensors",
                   {{"model.embed_tokens.weight", DType::F32, {2, 3}, values.data()},
                    {"model.norm.weight", DType::F32, {3}, values.data()}},
                   {{"format", "pt"}});
  writeSafetensors(dir + "/model-00002-of-00002.safetensors",
                   {{"lm_head.weight", DType::BF16, {2, 2}, halves.data()},
                    {"model.layers.0.input_layernorm.weight", DType::BF16, {4}, halves.data()}});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::string path = bonsai::fuzz::writeScratchFile("model.safetensors.index.json", data, size);
  try {
    Checkpoint checkpoint = Checkpoint::open(path);
    for (const SafetensorsEntry &entry : checkpoint.tensors()) {
      if (!entry.runtimeDType)
        continue;
      std::vector<uint8_t> buffer(size_t(entry.numel) * dtypeSize(*entry.runtimeDType));
      TensorView view;
      view.data = buffer.data();
      view.dtype = *entry.runtimeDType;
      view.shape = entry.shape;
      checkpoint.read(entry, view);
    }
  } catch (const Error &) {
  }
  return 0;
}
