//===- Random.h - The runtime's deterministic random number generator -----===//
//
// Random weights and random tokens must be the same on every machine and with every standard
// library, so the runtime uses its own generator (xoshiro256**, seeded through splitmix64) and
// its own normal transform (Box-Muller) instead of <random>'s distributions, whose algorithms
// the standard leaves to each library.
//
//===----------------------------------------------------------------------===//

#ifndef BONSAI_RUNTIME_RANDOM_H
#define BONSAI_RUNTIME_RANDOM_H

#include <cmath>
#include <cstdint>
#include <string_view>

namespace bonsai::rt {

/// One step of splitmix64: advances `state` and returns a well-mixed 64-bit value.
inline uint64_t splitmix64(uint64_t &state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// 64-bit FNV-1a of `text`, to derive a per-name stream from a seed.
inline uint64_t fnv1a64(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

/// xoshiro256** (Blackman and Vigna), with the normal and bounded draws the runtime needs.
class Rng {
public:
  /// Seeds the four state words from `seed` with splitmix64 (never all zero).
  explicit Rng(uint64_t seed) {
    for (uint64_t &word : s)
      word = splitmix64(seed);
  }

  /// The next 64 random bits.
  uint64_t next() {
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
  }

  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }

  /// Uniform integer in [0, n), n > 0, without modulo bias (rejection sampling).
  uint64_t below(uint64_t n) {
    uint64_t limit = ~uint64_t(0) - (~uint64_t(0) % n + 1) % n;
    uint64_t x;
    do
      x = next();
    while (x > limit);
    return x % n;
  }

  /// Standard normal by Box-Muller; the second value of each pair is kept for the next call.
  double normal() {
    if (hasSpare) {
      hasSpare = false;
      return spare;
    }
    double u1 = 1.0 - uniform(); // (0, 1]: log stays finite
    double u2 = uniform();
    double r = std::sqrt(-2.0 * std::log(u1));
    double angle = 6.283185307179586 * u2;
    spare = r * std::sin(angle);
    hasSpare = true;
    return r * std::cos(angle);
  }

private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  uint64_t s[4];
  double spare = 0;
  bool hasSpare = false;
};

} // namespace bonsai::rt

#endif // BONSAI_RUNTIME_RANDOM_H
