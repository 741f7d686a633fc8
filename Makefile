# plait — one entry point: make, make test, make demo, make bench, make install.
#
#   make                 build everything into build/
#   make test            install missing packages, build, run every test (also under ASan/UBSan)
#   make demo            install missing packages, build, train a small GPT on the bundled corpus
#   make bench           GPT-2 124M step time against PyTorch, the data-parallel overlap, the
#                        step with the AdamW moments on disk against in memory, ZeRO 3's step
#                        against ZeRO 1's (with and without prefetch), make
#                        bench-comm, bench-memory, bench-ckpt and bench-tokenizer (not tests)
#   make bench-cost      the cost model's step against plait's measured one on this CPU: the
#                        demo plan and GPT-2 124M 4x64 (prints ratios; not a test)
#   make bench-comm      all-reduce and all-to-all bandwidth against Open MPI's (prints ratios;
#                        not a test)
#   make bench-tokenizer the BPE tokenizer's tokens/s per core beside js-tiktoken's, GPT-2 and
#                        o200k_base (prints ratios; not a test)
#   make bench-ckpt      checkpoint write rate against dd, async pause, resume time (GPT-2 124M;
#                        prints ratios; not a test)
#   make bench-memory    per-rank memory and pipeline bubble of real runs against plait
#                        check's predictions (prints ratios; not a test)
#   make test-gpu        the nccl backend on this machine's GPUs (tests/gpu/run.sh; not in make test)
#   make test-cuda       the CUDA backend on this machine's GPU: --selftest, the PyTorch referee
#                        on the GPU, GPU runs to the bit, resume, sanitizers (tests/gpu/test_cuda.sh)
#   make bench-cuda      GPT-2 124M bf16 on the GPU, 16x1024 and 32x1024: tokens/s, MFU, modelled vs
#                        measured step, beside PyTorch; and its fp8 block products against the bf16
#                        ones (bench/fp8_bench.c; not a test)
#   make gpu-check       one command for a GPU machine (within a 9-minute budget): the build
#                        libraries, the build, --selftest, test-cuda's checks, a compute-sanitizer
#                        memcheck, the multi-GPU checks (2 GPUs or more), then bench-cuda; one
#                        markdown report ($$OUT/gpu-check.md, else build/gpu-check.md) and its log.
#                        Exit 0 passed, 1 failed, 2 a build library missing, 77 no GPU
#                        (scripts/gpu_check.sh: GPU_CHECK_QUICK=1, GPU_CHECK_BUDGET_S,
#                        GPU_CHECK_STAGES, BENCH_*)
#   make install PREFIX=/usr/local   (make uninstall PREFIX=/usr/local removes what it put)
#
# BUILD selects the output directory; SAN=1 builds with AddressSanitizer + UBSan,
# TSAN=1 with ThreadSanitizer (make all BUILD=build-tsan TSAN=1; not part of make test).

BUILD   ?= build
PREFIX  ?= /usr/local
CC      ?= gcc
SAN     ?= 0
TSAN    ?= 0

VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)

WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wformat=2
HARDEN  := -fstack-protector-strong -fno-strict-overflow -fno-delete-null-pointer-checks
# the sanitized build lets signed overflow be undefined, so UBSan reports it
ifeq ($(SAN),1)
  HARDEN := $(filter-out -fno-strict-overflow,$(HARDEN))
endif
CPPFLAGS += -D_GNU_SOURCE -I. -DPLAIT_VERSION='"$(VERSION)"'
CFLAGS  ?= -O2 -g
CFLAGS  += -std=c17 $(WARN) $(HARDEN) -fopenmp -pthread
LDFLAGS += -fopenmp -pthread -Wl,-z,relro,-z,now
LDLIBS  := -ljansson -lhwloc -ldnnl -lopenblas -lpcre2-8 -lm

# CUDA (the CUDA op backend, kernels/cuda/*.cu, and what NCCL needs): the
# runtime's headers and libraries are looked for under CUDA_HOME
# (/usr/local/cuda) or the system's /usr/include and /usr/lib/x86_64-linux-gnu;
# the sanitized builds never use them (the CUDA runtime and ASan/TSan do not mix).
#
# The CUDA op backend: built where nvcc, cuda_runtime.h, cublasLt.h, libcudart
# and libcublasLt are found, for sm_80 and sm_90 (CUDA_ARCHS), with sm_90's PTX
# for later GPUs to compile at load; CUDA=0 leaves it
# out, and kernels/cuda/cuda_none.c then answers that there is none. Host code
# in the .cu files is held to -Wall -Wextra -Werror, and ptxas to no spills and
# no local memory (-Xptxas -warn-spills,-warn-lmem-usage with -Werror all-warnings).
#
# NCCL (the `nccl` collective backend, runtime/comm/comm_nccl.c, which loads libnccl and
# libcudart when a rank first asks for it: runtime/comm/nccl_api.h): built where
# nccl.h, libnccl, cuda_runtime.h and libcudart are found: under NCCL_HOME,
# CUDA_HOME, or the system's directories. NCCL=0 leaves it out; the sanitized
# builds always do. Without it, a communicator asking for nccl fails at init
# saying this build has none.
CUDA      ?= auto
NCCL      ?= auto
CUDA_HOME ?= /usr/local/cuda
NCCL_HOME ?= $(CUDA_HOME)
NVCC      ?= $(CUDA_HOME)/bin/nvcc
CUDA_ARCHS ?= 80 90
comma     := ,
find_dir   = $(firstword $(foreach d,$(1),$(if $(wildcard $(d)/$(2)),$(d))))
ifeq ($(SAN)$(TSAN),00)
  CUDA_INC := $(call find_dir,$(CUDA_HOME)/include /usr/include,cuda_runtime.h)
  CUDA_LIB := $(call find_dir,$(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib \
                /usr/lib/x86_64-linux-gnu,libcudart.so)
endif
ifeq ($(NCCL)$(SAN)$(TSAN),auto00)
  NCCL_INC := $(call find_dir,$(NCCL_HOME)/include $(CUDA_HOME)/include /usr/include,nccl.h)
  NCCL_LIB := $(call find_dir,$(NCCL_HOME)/lib $(NCCL_HOME)/lib64 $(CUDA_HOME)/lib64 \
                $(CUDA_HOME)/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu,libnccl.so)
endif
ifeq ($(CUDA)$(SAN)$(TSAN),auto00)
  LT_INC := $(call find_dir,$(CUDA_INC),cublasLt.h)
  LT_LIB := $(call find_dir,$(CUDA_LIB),libcublasLt.so)
  HAVE_CUDA := $(if $(and $(wildcard $(NVCC)),$(CUDA_INC),$(CUDA_LIB),$(LT_INC),$(LT_LIB)),1)
endif
HAVE_NCCL := $(if $(and $(NCCL_INC),$(NCCL_LIB),$(CUDA_INC),$(CUDA_LIB)),1)
ifeq ($(HAVE_NCCL),1)
  CPPFLAGS += -DPLAIT_HAVE_NCCL
  # -isystem: the CUDA headers are not ours to hold to -Wextra -Werror
  NCCL_CPPFLAGS := $(addprefix -isystem ,$(filter-out /usr/include,$(sort $(NCCL_INC) $(CUDA_INC))))
  LDLIBS += $(addprefix -L,$(sort $(NCCL_LIB) $(CUDA_LIB))) \
            $(addprefix -Wl$(comma)-rpath$(comma),$(sort $(NCCL_LIB) $(CUDA_LIB))) \
            -Wl,--push-state,--as-needed -lnccl -lcudart -Wl,--pop-state
endif
ifeq ($(HAVE_CUDA),1)
  NVCC_FLAGS := -std=c++17 -O3 -g -lineinfo -I. \
                $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a)$(comma)code=sm_$(a)) \
                -gencode arch=compute_$(lastword $(CUDA_ARCHS))$(comma)code=compute_$(lastword $(CUDA_ARCHS)) \
                -Xptxas -warn-spills,-warn-lmem-usage -Werror all-warnings \
                -Xcompiler -Wall$(comma)-Wextra$(comma)-Werror$(comma)-fstack-protector-strong \
                -Xcompiler -fPIC$(comma)-fvisibility=hidden
  # the backend is a shared object of its own, loaded by the runtime only for a GPU
  # (kernels/cuda/cuda_ops.h says why); the executables link only the loader
  CUDA_SO_LDLIBS := -L$(CUDA_LIB) -Wl,-rpath,$(CUDA_LIB) -lcublasLt -lcudart -lstdc++ -fopenmp
  LDLIBS += -ldl
endif

# cairo (plait plot draws with it): built where pkg-config finds it (Debian's
# libcairo2-dev, which scripts/deps.sh build installs). CAIRO=0 leaves it out;
# without it plait plot says which package to install.
CAIRO ?= auto
ifeq ($(CAIRO),auto)
  HAVE_CAIRO := $(shell pkg-config --exists cairo fontconfig 2>/dev/null && echo 1)
endif
# (fontconfig, which libcairo2-dev brings: its caches are freed at exit, for LeakSanitizer)
ifeq ($(HAVE_CAIRO),1)
  CAIRO_CPPFLAGS := -DPLAIT_HAVE_CAIRO \
                    $(patsubst -I%,-isystem %,$(shell pkg-config --cflags cairo fontconfig))
  CAIRO_LDLIBS   := $(shell pkg-config --libs cairo fontconfig)
endif

# libyaml (libyaml-dev): plait k8s writes and lints its manifests with it; only the plait CLI links it
YAML_LDLIBS := -lyaml

ifeq ($(SAN),1)
  CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
else
  CPPFLAGS += -D_FORTIFY_SOURCE=2
endif
ifeq ($(TSAN),1)
  CFLAGS  += -fsanitize=thread -fno-omit-frame-pointer
  LDFLAGS += -fsanitize=thread
endif

# The CPU kernels are the hot path: optimise harder (they carry their own
# per-ISA clones, so the binary still runs on any x86-64).
KERNEL_CFLAGS := -O3 -fno-math-errno

COMMON_SRC   := $(wildcard common/*.c) $(wildcard common/*/*.c)
KERNELS_SRC  := $(wildcard kernels/*.c) $(wildcard kernels/cpu/*.c)
# the CUDA backend's objects, or the stand-in that says there is none
CUDA_SRC     := $(wildcard kernels/cuda/*.cu)
CUDA_OBJ     := $(if $(HAVE_CUDA),$(patsubst %.cu,$(BUILD)/obj/%.o,$(CUDA_SRC)))
CUDA_SO      := $(if $(HAVE_CUDA),$(BUILD)/lib/plait/libplait_cuda.so)
ifeq ($(HAVE_CUDA),1)
  KERNELS_SRC += kernels/cuda/cuda_load.c
else
  KERNELS_SRC += kernels/cuda/cuda_none.c
endif
RUNTIME_SRC  := $(filter-out runtime/main.c,$(wildcard runtime/*.c)) $(wildcard runtime/comm/*.c)
ifneq ($(HAVE_NCCL),1)
  RUNTIME_SRC := $(filter-out runtime/comm/comm_nccl.c runtime/comm/nccl_api.c,$(RUNTIME_SRC))
endif
LAUNCHER_SRC := $(wildcard launcher/*.c) $(wildcard launcher/k8s/*.c)
SAMPLE_SRC   := $(wildcard sample/*.c)
TOKENIZER_SRC := $(wildcard tokenizer/*.c)
TEST_SRC     := $(wildcard tests/unit/test_*.c)
SPANK_SRC    := $(wildcard spank-plugin/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

LIB_COMMON   := $(BUILD)/lib/libplait_common.a
LIB_KERNELS  := $(BUILD)/lib/libplait_kernels.a
LIB_RUNTIME  := $(BUILD)/lib/libplait_runtime.a
LIB_SAMPLE   := $(BUILD)/lib/libplait_sample.a
LIB_TOKENIZER := $(BUILD)/lib/libplait_tokenizer.a
PLAIT        := $(BUILD)/bin/plait
PLAIT_TRAIN  := $(BUILD)/bin/plait-train
TESTS        := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRC))
TOOLS        := $(BUILD)/bin/gemm-bench $(BUILD)/bin/comm-bench $(BUILD)/bin/fp8-bench
# The nccl backend's tests on GPUs (tests/gpu/run.sh runs them; built wherever NCCL is)
GPU_TESTS    := $(if $(HAVE_NCCL),$(BUILD)/tests/gpu/test_nccl)
# The SPANK plugin: built where Slurm's headers are (libslurm-dev), and not
# with sanitizers (it is loaded into Slurm's own processes).
# Build it against the Slurm the cluster runs (SPANK plugins are not ABI compatible between
# Slurm's major releases): SLURM_HOME is that Slurm's prefix (its include/slurm/spank.h).
# SLURM=1 makes a missing spank.h an error, SLURM=0 leaves the plugin out without a word;
# by default (auto) a missing spank.h is said loudly and the rest builds.
SLURM_HOME   ?= /usr
SLURM        ?= auto
SPANK_H      := $(wildcard $(SLURM_HOME)/include/slurm/spank.h)
ifeq ($(SLURM)$(SPANK_H),1)
  $(error SLURM=1 but there is no $(SLURM_HOME)/include/slurm/spank.h: install libslurm-dev, or set SLURM_HOME to the prefix of the Slurm your cluster runs)
endif
ifeq ($(SLURM),0)
  SPANK_H :=
else ifeq ($(SPANK_H),)
  ifeq ($(filter 00,$(SAN)$(TSAN)),00)
    $(warning the Slurm plugin (spank_plait.so) is NOT built: no $(SLURM_HOME)/include/slurm/spank.h. Install libslurm-dev, or set SLURM_HOME to the prefix of the Slurm your cluster runs; SLURM=0 builds without it quietly)
  endif
endif
SPANK_CPPFLAGS := $(if $(filter-out /usr,$(SLURM_HOME)),-isystem $(SLURM_HOME)/include)
SPANK_SO     := $(if $(and $(SPANK_H),$(filter 00,$(SAN)$(TSAN))),$(BUILD)/lib/spank_plait.so)
# The plugin's submit-time check as a program (tests/spank/submit_check.c, for
# tests/integration/test_plan_property.sh): wherever Slurm's headers are, sanitized too
SPANK_CHECK  := $(if $(SPANK_H),$(BUILD)/tests/spank/submit_check)
SPANK_CHECK_SRC := tests/spank/submit_check.c $(addprefix spank-plugin/,submit.c policy.c msg.c config.c)

# plait's man page and bash completion, written from its help text (scripts/gen_docs.sh)
MAN_PAGE     := $(BUILD)/share/man/man1/plait.1
COMPLETION   := $(BUILD)/share/bash-completion/completions/plait

.PHONY: all test test-gpu test-cuda test-container bench-cuda gpu-check demo bench bench-tokenizer bench-comm bench-memory bench-ckpt bench-cost install uninstall docs clean deps-build deps-test format fuzz
all: $(PLAIT) $(PLAIT_TRAIN) $(CUDA_SO) $(TESTS) $(GPU_TESTS) $(TOOLS) $(SPANK_SO) $(SPANK_CHECK) docs

docs: $(MAN_PAGE) $(COMPLETION)
$(MAN_PAGE) $(COMPLETION) &: $(PLAIT) scripts/gen_docs.sh
	scripts/gen_docs.sh $(PLAIT) $(BUILD)/share

$(BUILD)/obj/kernels/%.o: kernels/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) $(KERNEL_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

# the CUDA backend, for every architecture in CUDA_ARCHS (make test checks the
# objects hold sm_80 and sm_90 code: tests/integration/test_cuda_build.sh)
$(BUILD)/obj/kernels/cuda/%.o: kernels/cuda/%.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCC_FLAGS) -MD -MP -MF $(@:.o=.d) -c $< -o $@
# the routing runs the CPU's float operations unfused, as C17 does: the same bits (moe.cu)
$(BUILD)/obj/kernels/cuda/moe.o: NVCC_FLAGS += -fmad=false

# the objects that print the version are rebuilt when it changes (a commit, a
# tree made dirty or clean): the stamp is rewritten only then
VERSION_STAMP := $(BUILD)/version.txt
$(shell mkdir -p $(BUILD) && [ "$$(cat $(VERSION_STAMP) 2>/dev/null)" = '$(VERSION)' ] || \
    echo '$(VERSION)' > $(VERSION_STAMP))
VERSIONED := $(shell grep -rl --include='*.c' PLAIT_VERSION common launcher runtime spank-plugin)
$(call obj,$(VERSIONED)) $(patsubst %.c,$(BUILD)/pic/%.o,$(VERSIONED)): $(VERSION_STAMP)

# the files that include the CUDA and NCCL headers
$(BUILD)/obj/runtime/comm/comm_nccl.o $(BUILD)/obj/runtime/comm/nccl_api.o: CPPFLAGS += $(NCCL_CPPFLAGS)
$(BUILD)/obj/tests/gpu/%.o: CPPFLAGS += $(NCCL_CPPFLAGS)
$(BUILD)/obj/tests/unit/test_comm_nccl.o: CPPFLAGS += $(NCCL_CPPFLAGS)
$(BUILD)/obj/launcher/cmd_plot.o: CPPFLAGS += $(CAIRO_CPPFLAGS)

# the reductions run over every byte a collective receives: optimised like the kernels
$(BUILD)/obj/runtime/comm/sock_reduce.o: CFLAGS += $(KERNEL_CFLAGS)

$(LIB_COMMON): $(call obj,$(COMMON_SRC))
$(LIB_KERNELS): $(call obj,$(KERNELS_SRC))
$(LIB_RUNTIME): $(call obj,$(RUNTIME_SRC))
$(LIB_SAMPLE): $(call obj,$(SAMPLE_SRC))
$(LIB_TOKENIZER): $(call obj,$(TOKENIZER_SRC))
# position-independent objects for the plugin
$(BUILD)/pic/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -fPIC -MMD -MP -c $< -o $@

$(patsubst %.c,$(BUILD)/pic/%.o,$(SPANK_SRC)): CPPFLAGS += $(SPANK_CPPFLAGS)
$(BUILD)/lib/spank_plait.so: $(patsubst %.c,$(BUILD)/pic/%.o,$(SPANK_SRC) $(COMMON_SRC)) spank-plugin/spank_plait.map
	@mkdir -p $(dir $@)
	$(CC) -shared -fPIC -Wl,--version-script=spank-plugin/spank_plait.map -Wl,-z,relro,-z,now \
		$(filter %.o,$^) -ljansson -lhwloc -lm -o $@

# (with the sticky error and the fp8 format's arithmetic it shares with the CPU
# backend; --no-undefined: it must need nothing from the executable that loads it)
$(CUDA_SO): $(CUDA_OBJ) $(BUILD)/pic/kernels/ops_error.o $(BUILD)/pic/kernels/cpu/fp8.o \
             kernels/cuda/libplait_cuda.map
	@mkdir -p $(dir $@)
	$(CXX) -shared -Wl,--version-script=kernels/cuda/libplait_cuda.map -Wl,-z,relro,-z,now \
		-Wl,--no-undefined \
		$(filter %.o,$^) $(CUDA_SO_LDLIBS) -o $@

$(BUILD)/lib/%.a:
	@mkdir -p $(dir $@)
	rm -f $@ && $(AR) rcs $@ $^

# Link order: runtime -> sample -> tokenizer -> kernels -> common.
LIBS := $(LIB_RUNTIME) $(LIB_SAMPLE) $(LIB_TOKENIZER) $(LIB_KERNELS) $(LIB_COMMON)

$(PLAIT_TRAIN): $(call obj,runtime/main.c) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# the CLI never links the training runtime (DESIGN: it reads the run directory through common/);
# plait sample runs the sampler (sample/) on a checkpoint's whole model
$(PLAIT): $(call obj,$(LAUNCHER_SRC)) $(LIB_SAMPLE) $(LIB_TOKENIZER) $(LIB_KERNELS) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) $(CAIRO_LDLIBS) $(YAML_LDLIBS) -o $@

$(BUILD)/bin/gemm-bench: $(call obj,bench/gemm_bench.c) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bin/fp8-bench: $(call obj,bench/fp8_bench.c) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bin/comm-bench: $(call obj,bench/comm_bench.c) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: $(call obj,tests/unit/%.c) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/gpu/test_nccl: $(call obj,tests/gpu/test_nccl.c) $(LIBS)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(call obj,$(SPANK_CHECK_SRC)): CPPFLAGS += $(SPANK_CPPFLAGS)
$(SPANK_CHECK): $(call obj,$(SPANK_CHECK_SRC)) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(if $(SPANK_CPPFLAGS),-L$(SLURM_HOME)/lib) -ljansson -lhwloc -lslurm -lm \
		-o $@

deps-build:
	@scripts/deps.sh build

deps-test:
	@scripts/deps.sh test

# make test: the README's test command (and what .ci/run calls).
JOBS := $(shell nproc 2>/dev/null || echo 2)

test: deps-test
	$(MAKE) -j$(JOBS) all
	$(MAKE) -j$(JOBS) all BUILD=build-asan SAN=1
	tests/run.sh

# make test-gpu: the nccl backend on this machine's GPUs (tests/gpu/run.sh)
test-gpu:
	tests/gpu/run.sh

# make test-cuda: the CUDA backend on this machine's GPU (exit 77 where there is none;
# make test runs the same checks inside tests/integration/test_cuda_build.sh)
test-cuda:
	$(MAKE) -j$(JOBS) all
	tests/gpu/test_cuda.sh

# make test-container: builds the Containerfile's image and trains in it (minutes: not in
# make test, whose tests/integration/test_containerfile.sh checks the file itself)
test-container:
	bash tests/container/test_container.sh

# make bench-cuda: GPT-2 124M on this machine's GPU (exit 77 where there is none)
bench-cuda:
	$(MAKE) -j$(JOBS) all
	bench/bench_cuda.sh

# make gpu-check: scripts/gpu_check.sh, which checks the libraries and builds itself
# (exit 77 where there is no GPU; make test runs it so in tests/integration/test_gpu_check.sh)
gpu-check:
	scripts/gpu_check.sh

demo: deps-build
	$(MAKE) -j$(JOBS) all
	scripts/demo.sh

bench: deps-test bench-comm bench-memory bench-ckpt bench-tokenizer
	$(MAKE) -j$(JOBS) all
	bench/bench.sh
	bench/overlap_bench.sh
	bench/offload_bench.sh
	bench/zero3_bench.sh
	bench/cp_bench.sh
	bench/dualpipe_moe_bench.sh

bench-cost: deps-test
	$(MAKE) -j$(JOBS) $(PLAIT) $(PLAIT_TRAIN)
	bench/cost_bench.sh

bench-tokenizer: deps-test
	$(MAKE) -j$(JOBS) $(PLAIT)
	bench/tokenizer_bench.sh

bench-comm: deps-test
	$(MAKE) -j$(JOBS) $(BUILD)/bin/comm-bench
	bench/comm_bench.sh

bench-ckpt: deps-test
	$(MAKE) -j$(JOBS) all
	bench/ckpt_bench.sh

bench-memory: deps-test
	$(MAKE) -j$(JOBS) $(PLAIT) $(PLAIT_TRAIN)
	bench/memory_bench.sh

# make install puts exactly these files (and make uninstall removes exactly them,
# then the directories only plait uses, when empty): the programs, the plugin,
# the man page, the bash completion, the docs (README, the Slurm admin guide as
# ADMIN.md, ARCHITECTURE.md) and the examples, the Kubernetes admin guide and its
# manifests (share/plait/k8s/).
DEST          := $(DESTDIR)$(PREFIX)
EXAMPLE_FILES := $(sort $(wildcard examples/*.md examples/*/*))
DOC_FILES     := README.md examples/slurm/ADMIN.md docs/ARCHITECTURE.md
K8S_FILES     := k8s/ADMIN.md $(sort $(wildcard k8s/examples/*))
INSTALLED     := $(addprefix $(DEST)/bin/,plait plait-train) \
                 $(if $(SPANK_SO),$(DEST)/lib/slurm/spank_plait.so) \
                 $(if $(CUDA_SO),$(DEST)/lib/plait/libplait_cuda.so) \
                 $(DEST)/share/man/man1/plait.1 $(DEST)/share/bash-completion/completions/plait \
                 $(addprefix $(DEST)/share/doc/plait/,$(notdir $(DOC_FILES))) \
                 $(addprefix $(DEST)/share/plait/,$(EXAMPLE_FILES) $(K8S_FILES))

install: $(PLAIT) $(PLAIT_TRAIN) $(CUDA_SO) $(SPANK_SO) docs
	install -d $(DEST)/bin $(DEST)/share/man/man1 $(DEST)/share/bash-completion/completions \
		$(DEST)/share/doc/plait \
		$(addprefix $(DEST)/share/plait/,$(sort $(dir $(EXAMPLE_FILES) $(K8S_FILES))))
	install -m 755 $(PLAIT) $(PLAIT_TRAIN) $(DEST)/bin/
	$(if $(SPANK_SO),install -d $(DEST)/lib/slurm && install -m 755 $(SPANK_SO) $(DEST)/lib/slurm/)
	$(if $(CUDA_SO),install -d $(DEST)/lib/plait && install -m 755 $(CUDA_SO) $(DEST)/lib/plait/)
	install -m 644 $(MAN_PAGE) $(DEST)/share/man/man1/
	install -m 644 $(COMPLETION) $(DEST)/share/bash-completion/completions/
	install -m 644 $(DOC_FILES) $(DEST)/share/doc/plait/
	$(foreach f,$(EXAMPLE_FILES) $(K8S_FILES),install -m 644 $(f) $(DEST)/share/plait/$(f) &&) true

uninstall:
	rm -f $(INSTALLED)
	-rmdir $(sort $(dir $(addprefix $(DEST)/share/plait/,$(EXAMPLE_FILES) $(K8S_FILES)))) \
		$(DEST)/share/plait/examples $(DEST)/share/plait/k8s $(DEST)/share/plait \
		$(DEST)/share/doc/plait \
		$(if $(CUDA_SO),$(DEST)/lib/plait) 2>/dev/null

format:
	clang-format -i $(shell git ls-files '*.c' '*.h')

clean:
	rm -rf build build-asan build-tsan

# ---- make fuzz: libFuzzer targets for the readers of untrusted input ---------------------
# tests/fuzz/README.md says how to run them. clang with libFuzzer, ASan and UBSan,
# into build-fuzz/ (which ignores itself in git). -fopenmp=libgomp: clang compiles
# the OpenMP pragmas out (the readers run no kernels, and one thread keeps runs
# reproducible) and links GCC's libgomp, the runtime oneDNN already loads; omp.h is
# clang's (libomp-dev).
FUZZ_BUILD    := build-fuzz
FUZZ_CC       := clang
FUZZ_SAN      := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_CPPFLAGS := -D_GNU_SOURCE -I. -DPLAIT_VERSION='"$(VERSION)"'
FUZZ_CFLAGS   := -std=c17 $(WARN) -O1 -g $(FUZZ_SAN) -fopenmp=libgomp -pthread
FUZZ_TARGETS  := $(patsubst tests/fuzz/%.c,$(FUZZ_BUILD)/%,$(wildcard tests/fuzz/fuzz_*.c))
fuzz_obj       = $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(1))
# the same libraries as the normal build, in its link order: runtime -> kernels -> common
FUZZ_LIBS     := $(addprefix $(FUZZ_BUILD)/lib/libplait_,runtime.a sample.a tokenizer.a kernels.a common.a)

fuzz: $(FUZZ_TARGETS)

$(FUZZ_BUILD)/.gitignore:
	@mkdir -p $(dir $@) && echo '*' >$@

$(FUZZ_BUILD)/obj/%.o: %.c | $(FUZZ_BUILD)/.gitignore
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CPPFLAGS) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

# (the fuzz build has no NCCL and no CUDA: FUZZ_CPPFLAGS define neither, and its
# kernels library takes kernels/cuda/cuda_none.c)
$(FUZZ_BUILD)/lib/libplait_runtime.a: $(call fuzz_obj,$(filter-out runtime/comm/comm_nccl.c runtime/comm/nccl_api.c,$(RUNTIME_SRC)))
$(FUZZ_BUILD)/lib/libplait_kernels.a: $(call fuzz_obj,$(filter-out kernels/cuda/cuda_none.c,$(KERNELS_SRC)) kernels/cuda/cuda_none.c)
$(FUZZ_BUILD)/lib/libplait_common.a: $(call fuzz_obj,$(COMMON_SRC))
$(FUZZ_BUILD)/lib/libplait_sample.a: $(call fuzz_obj,$(SAMPLE_SRC))
$(FUZZ_BUILD)/lib/libplait_tokenizer.a: $(call fuzz_obj,$(TOKENIZER_SRC))
$(FUZZ_LIBS):
	@mkdir -p $(dir $@)
	rm -f $@ && $(AR) rcs $@ $^

$(FUZZ_TARGETS): $(FUZZ_BUILD)/%: $(FUZZ_BUILD)/obj/tests/fuzz/%.o $(call fuzz_obj,tests/fuzz/harness.c) $(FUZZ_LIBS)
	$(FUZZ_CC) $(FUZZ_SAN) -fsanitize=fuzzer -fopenmp=libgomp -pthread $^ $(LDLIBS) -o $@

-include $(shell find $(FUZZ_BUILD)/obj -name '*.d' 2>/dev/null)

-include $(shell find $(BUILD)/obj $(BUILD)/pic -name '*.d' 2>/dev/null)
