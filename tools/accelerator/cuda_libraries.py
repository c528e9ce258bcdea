"""Gives TensorFlow 2.21 (built for CUDA 12) the CUDA libraries it opens, on a CUDA 13 image.

    python3 tools/accelerator/cuda_libraries.py LINK_DIR SITE [--dry-run]

TensorFlow's stream executor opens its CUDA libraries by their CUDA 12 names
(libcublas.so.12, libcufft.so.11, ...). The CUDA 12 runtime travels in SITE (the
nvidia-cuda-runtime-cu12 wheel, found through TensorFlow's RPATH), and so does every
other library after `run.sh pack --full`; a name SITE holds is left alone. Each other
one is linked in LINK_DIR (on LD_LIBRARY_PATH) to the image's newest library of the
same name, searched in the Python's site-packages (PyTorch's nvidia wheels) and
/usr/local/cuda*: CUDA 13 keeps these libraries' C APIs, TensorFlow looks its
functions up by name, and the NVIDIA driver runs both runtimes. The H100 run of
results/precision/gpu.md ran matmuls, convolutions and FFTs this way; the install
step checks the same. The found library's versioned siblings are linked too (cuDNN
opens its engine libraries by name).
"""

import glob
import os
import re
import site
import sys

# The CUDA 12 names TensorFlow opens -> the stem to look for.
WANTED = {"libcublas.so.12": "libcublas", "libcublasLt.so.12": "libcublasLt",
          "libcufft.so.11": "libcufft", "libcusolver.so.11": "libcusolver",
          "libcusparse.so.12": "libcusparse", "libcudnn.so.9": "libcudnn",
          "libnvJitLink.so.12": "libnvJitLink", "libcurand.so.10": "libcurand",
          "libnvrtc.so.12": "libnvrtc", "libcupti.so.12": "libcupti", "libnccl.so.2": "libnccl"}


def search_dirs() -> list[str]:
  dirs = [*site.getsitepackages(), *glob.glob("/usr/local/cuda*/lib64"),
          "/usr/lib/x86_64-linux-gnu"]
  return [d for d in dirs if os.path.isdir(d)]


def _major(path: str) -> int:
  found = re.search(r"\.so\.(\d+)", path)
  return int(found.group(1)) if found else -1


def find(stem: str, dirs: list[str]) -> str | None:
  """The newest real library file named stem.so.N under dirs (None if there is none)."""
  found = [p for d in dirs for p in glob.glob(os.path.join(d, "**", f"{stem}.so.*"),
                                              recursive=True)
           if os.path.isfile(p) and re.fullmatch(rf"{re.escape(stem)}\.so\.\d+(\.\d+)*",
                                                 os.path.basename(p))]
  return max(found, key=_major) if found else None


def main() -> int:
  link_dir, site_dir = sys.argv[1], sys.argv[2]
  dry = "--dry-run" in sys.argv
  os.makedirs(link_dir, exist_ok=True)
  for old in glob.glob(os.path.join(link_dir, "*")):   # A new install links afresh.
    if os.path.islink(old) and not dry:
      os.unlink(old)
  dirs = search_dirs()
  missing = []
  for name, stem in WANTED.items():
    if glob.glob(os.path.join(site_dir, "nvidia", "*", "lib", name)):
      print(f"{name}: carried in {site_dir}")
      continue
    target = find(stem, dirs)
    if target is None:
      missing.append(name)
      continue
    print(f"{name} -> {target}")
    links = {name: target}
    for sibling in glob.glob(os.path.join(os.path.dirname(target), "lib*.so.*")):
      links.setdefault(os.path.basename(sibling), sibling)   # Versioned names only.
    for link, to in links.items():
      path = os.path.join(link_dir, link)
      if not dry and not os.path.lexists(path):
        os.symlink(to, path)
  if missing:
    print(f"not found in {dirs}: {', '.join(missing)} (TensorFlow may still run without "
          f"them: nccl is for several GPUs, cupti for the profiler)")
  return 0


if __name__ == "__main__":
  sys.exit(main())
