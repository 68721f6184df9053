# bench/gpu_libs.sh - sourced by the bench/prepare_*_run.sh scripts: copies into DIR the shared
# libraries the CUDA build's binaries link that a GPU image may lack (OpenBLAS and its Fortran
# runtime; the tokenizers' SentencePiece, PCRE2 and ICU). The GPU-side scripts put DIR on
# LD_LIBRARY_PATH.
copy_gpu_libs() {
  local dir="$1" lib
  mkdir -p "$dir"
  for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libsentencepiece.so.0 \
      libpcre2-8.so.0 libicuuc.so.72 libicudata.so.72; do
    cp "$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')" "$dir/"
  done
}
