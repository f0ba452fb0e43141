#!/usr/bin/env bash
# Run transformers' own common model tests (ModelTesterMixin, GenerationTesterMixin) against our model.
#
# Assembles transformers' test machinery OUTSIDE this repository (third-party code is never committed) in
# $TRANSFORMERS_TESTS_DIR (default /tmp/hf_tests), then runs tests/hf_common/test_hf_common.py, and, with
# RUN_MARIAN=1, transformers' MarianModelTest on the same machinery as the baseline.
#
# Where the files come from:
#   - PyPI sdist of transformers==$TRANSFORMERS_VERSION (default: the installed version): tests/__init__.py,
#     tests/test_modeling_common.py, tests/test_configuration_common.py, tests/test_pipeline_mixin.py, ...
#   - Not in the sdist: transformers' own test machinery, unmodified, from $TRANSFORMERS_TESTS_SOURCE (default
#     ../shared/transformers_tests beside this repository, where CI lays it; its README gives the upstream commit),
#     or, with TRANSFORMERS_REPO set, from that transformers git checkout at $TRANSFORMERS_REF (default main):
#       tests/generation/{__init__,test_utils}.py          GenerationTesterMixin
#       tests/exporters/{__init__,test_export}.py          ExportTesterMixin (a base of ModelTesterMixin)
#       tests/utils/{__init__,test_configuration_utils}.py config_common_kwargs (ConfigTester)
#       tests/utils/tiny_model_summary.json, utils/test_module/  (imported by the files above)
#       tests/models/{__init__,marian/__init__,marian/test_modeling_marian}.py  the Marian baseline
#     The sdist files (test_modeling_common.py, ...) are the installed version's own.
#   - Patches applied to the copies (minimal; transformers' own CI runs them from the repo root):
#       1. generation/test_utils.py: `from tests.exporters.test_export import` -> `from ..exporters.test_export import`
#          (our repository has its own `tests` package; everything else in transformers' tests is relative).
#       2. utils/test_configuration_utils.py: `import httpx` made optional (huggingface_hub 2 ships httpx2; httpx is
#          only used by Hub staging tests).
#       3. src/transformers -> symlink to the installed package (test_pipeline_mixin.py imports it from there).
#       4. pytest.ini registering transformers' markers (their root conftest.py/pyproject.toml are not copied).
#
# Test dependencies: parameterized, pytest-timeout (in the dev extra).
# Usage: tests/hf_common/run.sh [extra pytest args]      e.g. RUN_MARIAN=1 tests/hf_common/run.sh -x
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-$REPO_ROOT/.venv/bin/python}"
DIR="${TRANSFORMERS_TESTS_DIR:-/tmp/hf_tests}"
VERSION="${TRANSFORMERS_VERSION:-$("$PYTHON" -c 'import transformers; print(transformers.__version__)')}"
SDIST_DIR="${SDIST_DIR:-/tmp/tfsd}"
export TRANSFORMERS_TESTS_DIR="$DIR"

mkdir -p "$DIR"
if [[ ! -f "$DIR/tests/test_modeling_common.py" ]]; then
    sdist="$SDIST_DIR/transformers-$VERSION.tar.gz"
    [[ -f "$sdist" ]] || "$PYTHON" -m pip download "transformers==$VERSION" --no-deps --no-binary :all: -d "$SDIST_DIR"
    tar xzf "$sdist" -C "$DIR" --strip-components=1 "transformers-$VERSION/tests"
fi

FROM_REPO=(
    tests/generation/__init__.py tests/generation/test_utils.py
    tests/exporters/__init__.py tests/exporters/test_export.py
    tests/utils/__init__.py tests/utils/test_configuration_utils.py tests/utils/tiny_model_summary.json
    tests/models/__init__.py tests/models/marian/__init__.py tests/models/marian/test_modeling_marian.py
)
if [[ -n "${TRANSFORMERS_REPO:-}" ]]; then
    ref="${TRANSFORMERS_REF:-main}"
    for f in "${FROM_REPO[@]}"; do
        mkdir -p "$DIR/$(dirname "$f")"
        git -C "$TRANSFORMERS_REPO" show "$ref:$f" > "$DIR/$f"
    done
    mkdir -p "$DIR/utils/test_module"
    for f in $(git -C "$TRANSFORMERS_REPO" ls-tree -r --name-only "$ref" utils/test_module); do
        git -C "$TRANSFORMERS_REPO" show "$ref:$f" > "$DIR/$f"
    done
else
    SOURCE="${TRANSFORMERS_TESTS_SOURCE:-$REPO_ROOT/../shared/transformers_tests}"
    for f in "${FROM_REPO[@]}" utils/test_module/__init__.py utils/test_module/custom_configuration.py; do
        [[ -f "$SOURCE/$f" ]] || continue
        mkdir -p "$DIR/$(dirname "$f")"
        cp "$SOURCE/$f" "$DIR/$f"
        chmod u+w "$DIR/$f"
    done
fi
for f in "${FROM_REPO[@]}"; do
    [[ -f "$DIR/$f" ]] || {
        echo "missing $DIR/$f: set TRANSFORMERS_TESTS_SOURCE or TRANSFORMERS_REPO (see the top of this script)" >&2
        exit 1
    }
done
[[ -f "$DIR/tests/__init__.py" ]] || : > "$DIR/tests/__init__.py"

# Patches 1-4 (idempotent).
sed -i 's/^from tests\.exporters\.test_export import/from ..exporters.test_export import/' \
    "$DIR/tests/generation/test_utils.py"
"$PYTHON" - "$DIR/tests/utils/test_configuration_utils.py" <<'EOF'
import sys
path = sys.argv[1]
text = open(path).read()
text = text.replace(
    "\nimport httpx\n",
    "\ntry:\n    import httpx\nexcept ImportError:  # PATCH: huggingface_hub 2 ships httpx2; only Hub tests use httpx\n"
    "    httpx = None\n",
)
open(path, "w").write(text)
EOF
mkdir -p "$DIR/src"
ln -sfn "$("$PYTHON" -c 'import os, transformers; print(os.path.dirname(transformers.__file__))')" \
    "$DIR/src/transformers"
cat > "$DIR/pytest.ini" <<'EOF'
[pytest]
markers =
    generate
    flash_attn_test
    flash_attn_3_test
    flash_attn_4_test
    torch_compile_test
    torch_export_test
    onnx_export_test
    executorch_export_test
    training_ci
    bitsandbytes
    slow
    is_pipeline_test
    is_staging_test
    not_device_test
    accelerate_tests
    agent_tests
EOF

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if [[ "${RUN_MARIAN:-0}" == 1 ]]; then
    (cd "$DIR" && "$PYTHON" -m pytest tests/models/marian/test_modeling_marian.py -k MarianModelTest \
        -p no:cacheprovider -q -rfEs --timeout 600 "$@") || true
fi
cd "$REPO_ROOT"
exec "$PYTHON" -m pytest tests/hf_common -p no:cacheprovider -q -rfEs --timeout 600 "$@"
