//===- CheckpointManifestFuzzer.cpp - libFuzzer target: manifest.json -----===//
//
// Feeds each input to parseCheckpointManifest as a checkpoint's manifest.json, as
// bonsai-run --resume reads it before it looks at any file: its JSON, members, format
// version, position, adapter identity, file list and its own checksum. Any input must end in a
// manifest or an rt::Error; anything else is a bug.
//
//===----------------------------------------------------------------------===//

#include "bonsai/runtime/Checkpoint.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace bonsai::rt;
  try {
    (void)parseCheckpointManifest(std::string_view(reinterpret_cast<const char *>(data), size),
                                  "checkpoint 'fuzz/step-00000001'",
                                  "fuzz/step-00000001/manifest.json");
  } catch (const Error &) {
  }
  return 0;
}
