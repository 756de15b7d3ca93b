# The two commands of the README: `make train` (demo run) and `make test`. Each sets itself up.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | cksum | cut -d' ' -f1)
PYTEST_ARGS ?=
# Test processes: most tests wait on one single-threaded train.py or DDP subprocess, so two workers keep both
# cores busy (pytest-xdist; TEST_JOBS=0 runs in one process).
TEST_JOBS ?= 2

.PHONY: install train test test-fast lint typecheck bench bench-data bench-startup gpu-check docker clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
# uv downloads, unpacks and byte-compiles in parallel: a fresh install in about a third of pip's time
# (docs/testing.md). It reads UV_INDEX_URL, not pip's configuration.
	$(PY) -m pip install -q 'uv>=0.13,<0.14'
	$(VENV)/bin/uv pip install --python $(PY) --compile-bytecode -q -e '.[dev,export,cluster]'
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

train: $(STAMP)   ## the demo: ResNet18 on embedded handwritten digits, CPU, a few minutes
	$(PY) train.py experiment=demo $(ARGS)

test: $(STAMP)    ## the test suite (CPU only; GPU tests skip without CUDA)
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

test-fast: $(STAMP)   ## the edit loop: every test not marked slow (no training run, DDP or subprocess)
	$(PY) -m pytest -n $(TEST_JOBS) --dist loadfile -m "not slow" $(PYTEST_ARGS)

lint: $(STAMP)   ## ruff's lint and format check (CI runs it before the tests)
	$(VENV)/bin/ruff check src tests train.py evaluate.py
	$(VENV)/bin/ruff format --check src tests train.py evaluate.py

typecheck: $(STAMP)   ## mypy on src/imgcls, settings in pyproject.toml [tool.mypy] (CI runs it after lint)
	$(VENV)/bin/mypy

# Input-pipeline throughput (docs/data-backends.md). Any folder of class folders of JPEGs works:
#   make bench-data BENCH_ROOT=/data/imagenet CORES=8 IMAGE_SIZE=224
CACHE      ?= $(or $(IMGCLS_CACHE),$(HOME)/.cache/imgcls)
BENCH_ROOT ?= $(CACHE)/imagenet-samples
CORES      ?= 2
IMAGE_SIZE ?= 224

# Without BENCH_ROOT / GPU_DATA, archives of sample photos are extracted into $(CACHE) (SAMPLES_DIR: where a
# development machine keeps them; any folder of class folders of JPEGs can be named instead).
SAMPLES_DIR ?= ../shared/datasets

$(CACHE)/imagenet-samples:   # 500 ImageNet photos, extracted outside the repository
	@test -f $(SAMPLES_DIR)/imagenet-samples-500.tar.gz || { echo "imgcls: error: no BENCH_ROOT given and no $(SAMPLES_DIR)/imagenet-samples-500.tar.gz; pass BENCH_ROOT=a folder of class folders of JPEGs" >&2; exit 2; }
	mkdir -p $(CACHE) && tar xzf $(SAMPLES_DIR)/imagenet-samples-500.tar.gz -C $(CACHE)

bench-data: $(STAMP) $(BENCH_ROOT)  ## img/s of torchvision vs dali_cpu vs the JPEG decode ceiling
	$(PY) -m imgcls.bench.data data.root=$(BENCH_ROOT) cores=$(CORES) image_size=$(IMAGE_SIZE) $(ARGS)

# Time to first training step and peak memory, torchvision vs dali_cpu (docs/data-backends.md "Startup"), on an
# ImageNet-shaped tree of hard links to BENCH_ROOT's photos (1000 classes x 1281 + 50 files; no image data copied):
#   make bench-startup ARGS="--classes 10 --train 20 --val 5"
bench-startup: $(STAMP) $(BENCH_ROOT)  ## time to first step and memory per backend on 1.33M files
	$(PY) -m imgcls.bench.startup $(BENCH_ROOT) $(ARGS)

# GPU acceptance (src/imgcls/bench/gpu_check.py): every GPU path for a few dozen steps, one table next to NVIDIA's
# published img/s, non-zero exit on any failure; on a CPU-only machine one line and exit 0.
#   make gpu-check GPU_DATA=/data/imagenet ARGS="--steps 40"      (ARGS="--dry-run": print the commands only)
GPU_DATA ?= $(CACHE)/cifar10

$(CACHE)/cifar10:   # CIFAR-10 as JPEGs (train/ and val/), extracted outside the repository
	@test -f $(SAMPLES_DIR)/cifar10-jpeg.tar.gz || { echo "imgcls: error: no GPU_DATA given and no $(SAMPLES_DIR)/cifar10-jpeg.tar.gz; pass GPU_DATA=a folder with train/ and val/ class folders" >&2; exit 2; }
	mkdir -p $@ && tar xzf $(SAMPLES_DIR)/cifar10-jpeg.tar.gz -C $@

gpu-check: $(STAMP) $(GPU_DATA)  ## every GPU path on this machine's GPUs (exit 0 with a note without CUDA)
	$(PY) -m imgcls.bench.gpu_check --data $(GPU_DATA) $(ARGS)

# Images (docs/distributed.md "Docker"): GPU servers on NVIDIA's PyTorch container, CPU on python-slim.
#   make docker IMAGE=registry/imgcls NGC_TAG=25.10-py3
IMAGE   ?= imgcls
NGC_TAG ?= 25.10-py3

docker:   ## build $(IMAGE):gpu and $(IMAGE):cpu (needs a Docker engine)
	docker build -f docker/Dockerfile --build-arg NGC_TAG=$(NGC_TAG) -t $(IMAGE):gpu .
	docker build -f docker/Dockerfile.cpu -t $(IMAGE):cpu .

clean:
	rm -rf outputs .pytest_cache
