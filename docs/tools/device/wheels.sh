#!/bin/bash
# The packages mcfl needs that the device machine's image lacks (it has torch, numpy, pandas,
# scikit-learn, scipy, PyYAML, tqdm, filelock, attrs), as cp312 wheels in .whl/ (git-ignored):
# jsonschema (config validation), pydantic and annotated-types (a method parameter's bounds and choices,
# checked when a run is parsed: without them FedFusion's `operator` fails before training), and OR-Tools
# for FedGSP's ICG.
set -e
cd "$(dirname "$0")/../../.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1 \
  annotated-types==0.7.0 pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5 \
  ortools==9.15.6755 absl-py==2.5.1 immutabledict==4.3.1 protobuf==6.33.6
du -sh .whl
