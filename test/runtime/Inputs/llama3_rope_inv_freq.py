#!/usr/bin/python3
"""test/runtime/Inputs/llama3_rope_inv_freq.py - the reference inverse frequencies of
PackedSequencesTest's Llama3InverseFrequenciesMatchNumPy.

transformers' `_compute_default_rope_parameters` and `_compute_llama3_parameters`
(modeling_rope_utils.py), written in NumPy in fp64, for Llama 3.1 8B's rope: theta 500000,
head_dim 128, rope_scaling {factor 8, low_freq_factor 1, high_freq_factor 4,
original_max_position_embeddings 8192}. Prints the 64 values as a C++ initializer list; the test
holds the runtime's ropeInverseFrequencies to them within 1e-12 relative.
"""

import math

import numpy as np


def llama3_inv_freq(base, dim, factor, low_freq_factor, high_freq_factor, old_context_len):
    inv_freq = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.int64).astype(np.float64) / dim))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (
        high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return np.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


if __name__ == "__main__":
    values = llama3_inv_freq(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    print(",\n".join("%.17g" % v for v in values))
