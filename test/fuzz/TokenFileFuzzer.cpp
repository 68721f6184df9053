//===- TokenFileFuzzer.cpp - libFuzzer target: token files ----------------===//
//
// Writes each input as a token file and reads it as bonsai-run --data does: the version-1 or
// version-2 header (docs/data-format.md), the document ends and the loss mask; then reads
// every token and mask bit, and draws the first batches of [2, 8] rows (version 1: windows of
// the stream; version 2: documents packed into shuffled rows). Any input must end in batches
// or an rt::Error; anything else is a bug.
//
//===----------------------------------------------------------------------===//

#include "FuzzFiles.h"

#include "bonsai/runtime/Data.h"
#include "bonsai/runtime/Tensor.h"

#include <cstdint>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  using namespace bonsai::rt;
  std::string path = bonsai::fuzz::writeScratchFile("tokens.bin", data, size);
  try {
    TokenFile file(path);
    std::vector<uint32_t> tokens;
    file.read(0, size_t(file.count()), tokens);
    if (file.version() == kTokenFileVersion2) {
      std::vector<uint8_t> mask;
      file.readMask(0, size_t(file.count()), mask);
    }
  } catch (const Error &) {
  }
  try {
    // A vocabulary that every 4-byte id is below, so batches are drawn from any valid file.
    TokenLoader loader(path, /*batch=*/2, /*seq=*/8, /*vocab=*/int64_t(1) << 32, /*seed=*/7);
    uint64_t batches = loader.fileBatches();
    for (uint64_t step = 0; step < 3; ++step)
      (void)loader.batch(step % (batches ? batches : 1));
  } catch (const Error &) {
  }
  return 0;
}
