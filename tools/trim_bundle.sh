#!/bin/bash
# Shrink a device bundle of ../shared/device/make_bundle.sh so that it travels beside the repo: a call carries 64 MiB
# in all (disk usage of the tracked files plus the bundle), and the run records in docs/runs grow that side by about
# 0.4 MB per GPU run. On 2026-12-05 .devbundle17 (55.5 MiB) plus the repo (10.7 MiB) no longer fitted; trimmed, 52.6.
#
#   usage: tools/trim_bundle.sh BUNDLE_DIR        (rewrites BUNDLE_DIR/part*.tar.xz in place)
#
# What goes, and why the GPU box never loads it (read in the 0.5.17 row's site-packages):
# - zstandard/_cffi*.so: zstandard imports backend_c unless PYTHON_ZSTANDARD_IMPORT_POLICY asks for cffi;
# - tvm_ffi/lib/libtvm_ffi_testing.so: loaded only by tvm_ffi.testing, which neither sglang nor flashinfer imports;
# - torch_memory_saver_hook_mode_*.abi3.so other than *_cu13: torch_memory_saver globs `<stem>_cu<major>.*.so` for
#   the CUDA major of torch (13 on the box: torch 2.11.0+cu130); the unsuffixed ones are ROCm's.
# The parts are recompressed in one xz thread at -9e: make_bundle's -T2 splits them into blocks that compress worse.
set -euo pipefail
DIR=$(realpath "${1:?bundle folder}")
DROP=(zstandard/_cffi.cpython-312-x86_64-linux-gnu.so tvm_ffi/lib/libtvm_ffi_testing.so
      torch_memory_saver_hook_mode_preload.abi3.so torch_memory_saver_hook_mode_preload_cu12.abi3.so
      torch_memory_saver_hook_mode_torch.abi3.so torch_memory_saver_hook_mode_torch_cu12.abi3.so)
for part in "$DIR"/part*.tar.xz; do
  work=$(mktemp -d /tmp/trim.XXXXXX)
  xz -dc "$part" | tar -xf - -C "$work"
  for f in "${DROP[@]}"; do rm -f "$work/$f"; done
  (cd "$work" && tar -cf - $(ls -A) | xz -9e -T1 > "$part.new")
  mv "$part.new" "$part"
  rm -rf "$work"
done
du -s --block-size=1M "$DIR"
