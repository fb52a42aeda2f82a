# Rekindle - plain GNU make. `make` builds into build/; see README.md for the targets.
#
#   make                      library, CLI, example trainer          (build/)
#   make check                install deps, build, run every test suite
#   make check-<suite>        one suite, e.g. make check-common      (no dependency install)
#   make demo                 install deps, build, run the demo
#   make bench                run the benchmarks (bench/run)
#   make bench-peers          Rekindle beside current PyTorch (DCP, Gloo) and TorchFT, in one
#                             run (bench/peers/run; makes their venv first: bench/peers/setup)
#   make check-python PYTHON=/path/to/python   the Python suite under another interpreter
#                             (e.g. bench/peers/venv/bin/python: PyTorch 2.x)
#   make chaos                run the chaos campaign (chaos/run)
#   make fuzz [FUZZ_S=60]     build the libFuzzer targets with clang (build/fuzz) and run
#                             each for FUZZ_S seconds; fails on any finding (docs/FUZZ.md)
#   make install PREFIX=/usr/local [DESTDIR=...]
#   make wheel                dist/rekindle-*.whl: the Python package with librekindle and the
#                             `rekindle` command inside (offline, Debian's setuptools and pip:
#                             docs/PYTHON.md); `pip install .` from the source tree does the same
#   make clean
#   make crash-sweep          the full crash-consistency sweep (tests/test_crash, every case)
# Variables: SANITIZE=1 (ASan + UBSan, builds into build/asan), TSAN=1 (ThreadSanitizer,
#            builds into build/tsan; make check runs the threaded suites), USE_CUDA=auto|yes|no,
#            CUDA_HOME=/usr/local/cuda, NCCL_HOME=$(CUDA_HOME), BUILD=dir, V=1 (show commands).

SANITIZE ?= 0
TSAN     ?= 0
ifeq ($(SANITIZE)$(TSAN),11)
$(error SANITIZE=1 and TSAN=1 cannot be combined (ASan and TSan exclude each other))
endif
ifeq ($(SANITIZE),1)
BUILD    ?= build/asan
else ifeq ($(TSAN),1)
BUILD    ?= build/tsan
else
BUILD    ?= build
endif
# One spelling per build directory: `build`, `./build/` and `$(CURDIR)/build` are the same
# objects, and the dependency files (-MMD) name them as the make that compiled them did. A
# make that spelled the directory otherwise looked for other targets and saw no header behind
# an object: a changed header rebuilt some objects and not others (the Python wheel's make
# passes an absolute BUILD), and the library mixed two layouts of a struct.
override BUILD := $(patsubst $(CURDIR)/%,%,$(abspath $(BUILD)))
ifneq ($(abspath $(BUILD)),$(BUILD))
$(abspath $(BUILD))/%: $(BUILD)/% ; # a target named by its absolute path is the same file
endif
PREFIX   ?= /usr/local
USE_CUDA ?= auto
CUDA_HOME ?= /usr/local/cuda
NCCL_HOME ?= $(CUDA_HOME)
VERSION  := $(shell sed -n 's/^\#define REKINDLE_VERSION_STRING "\(.*\)"/\1/p' include/rekindle.h)
ABI      := $(shell sed -n 's/^\#define REKINDLE_ABI_VERSION \([0-9]*\)$$/\1/p' include/rekindle.h)

CC       := mpicc
PKGS     := hdf5 liburing libxxhash libsodium
Q        := $(if $(V),,@)

# Dependencies are looked up only when something is built (not for clean/help).
ifeq ($(filter clean help,$(MAKECMDGOALS)),)
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CHECK_CFLAGS := $(shell pkg-config --cflags check 2>/dev/null)
CHECK_LIBS   := $(shell pkg-config --libs check 2>/dev/null)
endif

# ---- optional CUDA + NCCL, detected once --------------------------------------------
# The CUDA runtime under CUDA_HOME, NCCL under NCCL_HOME (default: the same tree; a pip
# wheel's nvidia/nccl works too). Features of a newer NCCL are built only when its nccl.h
# has them: ncclCommShrink (NCCL >= 2.27) -> RK_HAVE_NCCL_SHRINK.
CUDA_FOUND := no
ifneq ($(USE_CUDA),no)
ifneq ($(wildcard $(CUDA_HOME)/include/cuda_runtime.h),)
ifneq ($(wildcard $(NCCL_HOME)/include/nccl.h),)
ifneq ($(wildcard $(CUDA_HOME)/lib64/libcudart.so $(CUDA_HOME)/lib/libcudart.so),)
ifneq ($(wildcard $(NCCL_HOME)/lib64/libnccl.so* $(NCCL_HOME)/lib/libnccl.so*),)
CUDA_FOUND := yes
endif
endif
endif
endif
endif
ifeq ($(USE_CUDA)-$(CUDA_FOUND),yes-no)
$(error USE_CUDA=yes but the CUDA runtime (CUDA_HOME=$(CUDA_HOME)) or NCCL (NCCL_HOME=$(NCCL_HOME)) was not found)
endif
ifeq ($(CUDA_FOUND),yes)
CUDA_LIBDIR := $(firstword $(dir $(wildcard $(CUDA_HOME)/lib64/libcudart.so $(CUDA_HOME)/lib/libcudart.so)))
NCCL_LIBDIR := $(firstword $(dir $(wildcard $(NCCL_HOME)/lib64/libnccl.so* $(NCCL_HOME)/lib/libnccl.so*)))
# A wheel ships only libnccl.so.2: link it by its full name then.
NCCL_LINK   := $(if $(wildcard $(NCCL_LIBDIR)libnccl.so),-lnccl,-l:libnccl.so.2)
NCCL_VER    := $(shell sed -n 's/^\#define NCCL_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' $(NCCL_HOME)/include/nccl.h | paste -sd.)
NCCL_SHRINK := $(shell awk '/^\#define NCCL_(MAJOR|MINOR) / {v[$$2] = $$3} END {print (v["NCCL_MAJOR"] > 2 || (v["NCCL_MAJOR"] == 2 && v["NCCL_MINOR"] >= 27)) ? "yes" : "no"}' $(NCCL_HOME)/include/nccl.h)
# NCCL's directories first: CUDA_HOME may hold another NCCL of its own.
CUDA_CFLAGS := $(if $(filter $(CUDA_HOME),$(NCCL_HOME)),,-I$(NCCL_HOME)/include) -I$(CUDA_HOME)/include \
               -DRK_HAVE_CUDA=1 -DRK_HAVE_NCCL=1 $(if $(filter yes,$(NCCL_SHRINK)),-DRK_HAVE_NCCL_SHRINK=1)
# NCCL is not linked: ring/ring_nccl.c finds the process's libnccl.so.2 at run time (the
# rpath to NCCL_LIBDIR is where it looks when none is loaded yet); the benchmark that calls
# NCCL itself links it.
CUDA_LIBS   := $(if $(filter $(CUDA_LIBDIR),$(NCCL_LIBDIR)),,-L$(NCCL_LIBDIR) -Wl,-rpath,$(NCCL_LIBDIR)) -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) \
               -lcudart
$(BUILD)/bench/bench_ring_nccl: ALL_LDLIBS += $(NCCL_LINK)
CUDA_DESC   := CUDA $(shell awk '/^\#define CUDART_VERSION/ {printf "%d.%d", $$3/1000, ($$3%1000)/10}' $(CUDA_HOME)/include/cuda_runtime_api.h) under $(CUDA_HOME) + NCCL $(NCCL_VER) under $(NCCL_HOME) (ncclCommShrink $(if $(filter yes,$(NCCL_SHRINK)),built,not built: NCCL < 2.27)): building the GPU parts
else
CUDA_DESC   := CUDA/NCCL $(if $(filter no,$(USE_CUDA)),disabled (USE_CUDA=no),not found (CUDA_HOME=$(CUDA_HOME), NCCL_HOME=$(NCCL_HOME))): CPU-only build
endif

# ---- flags --------------------------------------------------------------------------
CFLAGS   ?= -O2 -g
WARN     := -Wall -Wextra -Werror -Wshadow -Wno-unused-parameter
ALL_CFLAGS := -std=gnu11 $(WARN) $(CFLAGS) -fPIC -pthread -D_GNU_SOURCE -Iinclude -Icommon \
              $(PKG_CFLAGS) $(CUDA_CFLAGS) -MMD -MP
ALL_LDLIBS := $(PKG_LIBS) $(CUDA_LIBS) -lm -pthread
ifeq ($(SANITIZE),1)
SAN      := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
ALL_CFLAGS += $(SAN)
LDFLAGS  += $(SAN)
endif
ifeq ($(TSAN),1)
SAN      := -fsanitize=thread -fno-omit-frame-pointer
ALL_CFLAGS += $(SAN)
LDFLAGS  += $(SAN)
endif
# The suites that run threads of the library (the checkpoint writer, the detector, the
# recovery paths, the multi-process ring and training jobs): what make check runs under
# TSAN=1. Under TSan tests/run stretches the tests' own bounds and the detector's heartbeat
# period by RK_TEST_TIME_SCALE (default 4), so an instrumented job is not mistaken for a
# dead one (docs/CHAOS.md, "ThreadSanitizer").
TSAN_SUITES := common vfd ckpt hang crash detector recover ring train_mpi

# ---- sources --------------------------------------------------------------------------
LIB_DIRS := common formats ckpt detector ring recover
GPU_PAT  := %_cuda.c %_nccl.c
LIB_ALL  := $(wildcard $(addsuffix /*.c,$(LIB_DIRS)))
LIB_SRC  := $(if $(filter yes,$(CUDA_FOUND)),$(LIB_ALL),$(filter-out $(GPU_PAT),$(LIB_ALL)))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o)
CLI_SRC  := $(wildcard tools/*.c)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
EX_SRC   := $(wildcard examples/*.c)
EX_BIN   := $(EX_SRC:examples/%.c=$(BUILD)/bin/%)
BENCH_SRC := $(filter-out $(if $(filter yes,$(CUDA_FOUND)),,$(GPU_PAT)),$(wildcard bench/*.c))
BENCH_BIN := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
TEST_SRC := $(filter-out $(if $(filter yes,$(CUDA_FOUND)),,$(GPU_PAT)),$(wildcard tests/test_*.c))
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_AUX := $(wildcard tests/harness*.c)
PROG_SRC := $(filter-out $(if $(filter yes,$(CUDA_FOUND)),,$(GPU_PAT)),$(wildcard tests/prog_*.c))
PROG_BIN := $(PROG_SRC:tests/%.c=$(BUILD)/tests/%)
TEST_AUX_OBJ := $(TEST_AUX:%.c=$(BUILD)/obj/%.o)

LIB_A    := $(BUILD)/lib/librekindle.a
LIB_SO   := $(BUILD)/lib/librekindle.so
CLI      := $(BUILD)/bin/rekindle

.PHONY: build-tests all check crash-sweep demo bench bench-peers chaos fuzz fuzz-targets install wheel clean deps config help
.DEFAULT_GOAL := all

all: config $(LIB_A) $(LIB_SO) $(CLI) $(EX_BIN) $(BUILD)/rekindle.pc

config:
	@echo "rekindle $(VERSION): $(CUDA_DESC)$(if $(filter 1,$(SANITIZE)), [ASan+UBSan])$(if $(filter 1,$(TSAN)), [TSan])"

deps:
	@scripts/install-deps

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(if $(Q),@echo "  CC    $<")
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

$(LIB_A): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(Q)rm -f $@ && ar rcs $@ $^

$(LIB_SO): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(Q)$(CC) -shared -Wl,-soname,librekindle.so.$(ABI) $(LDFLAGS) -o $@ $^ $(ALL_LDLIBS)
	$(Q)ln -sf librekindle.so $(dir $@)librekindle.so.$(ABI)

$(CLI): $(CLI_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $(CLI_OBJ) $(LIB_A) $(ALL_LDLIBS)

$(BUILD)/bin/%: $(BUILD)/obj/examples/%.o $(LIB_A)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIB_A) $(ALL_LDLIBS) $(EX_LDLIBS)

# rk-train --device cuda: its kernels (examples/rk-train-cuda.cu) are built with nvcc when
# CUDA is found and nvcc is there. -fmad=false and IEEE division and square root keep them
# bitwise equal to the C loops (docs/RK-TRAIN.md); warnings are errors, as for the C code.
NVCC       ?= $(CUDA_HOME)/bin/nvcc
NVCC_ARCH  ?= -gencode=arch=compute_90,code=sm_90 -gencode=arch=compute_75,code=compute_75
NVCC_FLAGS := -O2 -g -std=c++17 -fmad=false -prec-div=true -prec-sqrt=true -ftz=false $(NVCC_ARCH) \
              -Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror,-fPIC -MMD -MP
ifeq ($(CUDA_FOUND)-$(if $(wildcard $(NVCC)),yes,no),yes-yes)
$(BUILD)/obj/examples/rk-train.o $(BUILD)/obj/tests/test_train.o: ALL_CFLAGS += -DRK_TRAIN_CUDA=1
$(BUILD)/bin/rk-train: $(BUILD)/obj/examples/rk-train-cuda.cu.o
$(BUILD)/bin/rk-train: EX_LDLIBS := -lstdc++
$(BUILD)/obj/examples/%.cu.o: examples/%.cu
	@mkdir -p $(dir $@)
	$(if $(Q),@echo "  NVCC  $<")
	$(Q)$(NVCC) $(NVCC_FLAGS) -c $< -o $@
endif
# rk-train whose --device cuda runs those kernels on the host, thread after thread
# (tests/cuda_emu.h): the train suite compares it with --device cpu in every build.
EMU_TRAIN := $(BUILD)/tests/rk-train-emu
$(BUILD)/obj/tests/rk-train-emu.o: examples/rk-train.c
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(ALL_CFLAGS) -DRK_TRAIN_CUDA=1 -DRKT_EMULATE=1 -c $< -o $@
$(BUILD)/obj/tests/rk-train-cuda-emu.o: examples/rk-train-cuda.cu tests/cuda_emu.h examples/rk-train-cuda.h
	@mkdir -p $(dir $@)
	$(Q)$(CXX) -x c++ -std=c++17 $(WARN) $(CFLAGS) -DRKT_EMULATE=1 -Itests -c $< -o $@
$(EMU_TRAIN): $(BUILD)/obj/tests/rk-train-emu.o $(BUILD)/obj/tests/rk-train-cuda-emu.o $(LIB_A)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $(filter %.o,$^) $(LIB_A) $(ALL_LDLIBS) -lstdc++
build-tests check-train: $(EMU_TRAIN)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIB_A)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(LIB_A) $(ALL_LDLIBS)

$(BUILD)/obj/tests/%.o: ALL_CFLAGS += $(CHECK_CFLAGS)
$(BUILD)/tests/prog_%: $(BUILD)/obj/tests/prog_%.o $(LIB_A)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(LIB_A) $(ALL_LDLIBS)

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(TEST_AUX_OBJ) $(LIB_A)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(TEST_AUX_OBJ) $(LIB_A) $(CHECK_LIBS) $(ALL_LDLIBS)

$(BUILD)/rekindle.pc: Makefile
	@mkdir -p $(dir $@)
	$(Q)printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$${prefix}/lib' 'includedir=$${prefix}/include' '' \
	  'Name: rekindle' 'Description: fault-tolerant data-parallel training: checkpoints, failure detection, recovery' \
	  'Version: $(VERSION)' 'Requires.private: $(PKGS)' \
	  'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -Wl,-rpath,$${libdir} -lrekindle' \
	  'Libs.private: $(shell mpicc --showme:link) $(CUDA_LIBS) -lm -pthread' > $@

build-tests: all $(TEST_BIN) $(PROG_BIN) $(BENCH_BIN)

check: deps
	@$(MAKE) --no-print-directory build-tests
	@RK_TEST_SANITIZE=$(SANITIZE) RK_TEST_TSAN=$(TSAN) tests/run $(BUILD) $(if $(filter 1,$(TSAN)),$(TSAN_SUITES))

check-%: all $(PROG_BIN) $(BUILD)/tests/test_%
	@$(if $(PYTHON),RK_TEST_PYTHON=$(if $(wildcard $(PYTHON)),$(abspath $(PYTHON)),$(PYTHON)) )RK_TEST_SANITIZE=$(SANITIZE) RK_TEST_TSAN=$(TSAN) tests/run $(BUILD) $*

crash-sweep: all $(PROG_BIN) $(BUILD)/tests/test_crash
	@RK_CRASH_STRIDE=1 RK_TEST_SANITIZE=$(SANITIZE) RK_TEST_TSAN=$(TSAN) tests/run $(BUILD) crash

demo: deps
	@$(MAKE) --no-print-directory all
	@scripts/demo $(BUILD)

bench: all $(BENCH_BIN) $(PROG_BIN)
	@bench/run $(BUILD)

bench-peers: all $(BENCH_BIN) $(PROG_BIN)
	@bench/peers/setup
	@bench/peers/run $(BUILD)

chaos: deps
	@$(MAKE) --no-print-directory all
	@chaos/run --build $(BUILD)

# ---- fuzzing: the library again with clang, libFuzzer's coverage and ASan + UBSan -------
FUZZ_S     ?= 60
FUZZ_BUILD := build/fuzz
FUZZ_SRC   := $(wildcard fuzz/fuzz_*.c)
FUZZ_SAN   := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

fuzz: all $(BUILD)/tests/prog_ckpt $(BUILD)/fuzz-seeds/wire_seeds $(BUILD)/fuzz-seeds/ckpt_seeds
	@command -v clang >/dev/null || { echo "make fuzz: clang is needed (apt-get install clang)"; exit 2; }
	@OMPI_CC=clang $(MAKE) --no-print-directory BUILD=$(FUZZ_BUILD) USE_CUDA=no SANITIZE=0 \
	  CFLAGS='-O1 -g $(FUZZ_SAN) -fsanitize=fuzzer-no-link' fuzz-targets
	@fuzz/run $(BUILD) $(FUZZ_BUILD) $(FUZZ_S)

fuzz-targets: $(FUZZ_SRC:fuzz/%.c=$(BUILD)/fuzz/%)

$(BUILD)/fuzz/fuzz_%: $(BUILD)/obj/fuzz/fuzz_%.o $(LIB_A)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(FUZZ_SAN) -fsanitize=fuzzer -o $@ $< $(LIB_A) $(ALL_LDLIBS)

$(BUILD)/fuzz-seeds/%: $(BUILD)/obj/fuzz/%.o $(LIB_A)
	@mkdir -p $(dir $@)
	$(Q)$(CC) $(LDFLAGS) -o $@ $< $(LIB_A) $(ALL_LDLIBS)

install: all
	install -d $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include $(DESTDIR)$(PREFIX)/bin \
	           $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 0644 $(LIB_A) $(DESTDIR)$(PREFIX)/lib/
	install -m 0755 $(LIB_SO) $(DESTDIR)$(PREFIX)/lib/librekindle.so.$(VERSION)
	ln -sf librekindle.so.$(VERSION) $(DESTDIR)$(PREFIX)/lib/librekindle.so.$(ABI)
	ln -sf librekindle.so.$(ABI) $(DESTDIR)$(PREFIX)/lib/librekindle.so
	install -m 0644 include/rekindle.h $(DESTDIR)$(PREFIX)/include/
	install -m 0755 $(CLI) $(DESTDIR)$(PREFIX)/bin/
	sed 's|^prefix=.*|prefix=$(PREFIX)|' $(BUILD)/rekindle.pc > $(DESTDIR)$(PREFIX)/lib/pkgconfig/rekindle.pc
	install -d $(DESTDIR)$(PREFIX)/lib/python3/dist-packages/rekindle
	install -m 0644 python/rekindle/*.py $(DESTDIR)$(PREFIX)/lib/python3/dist-packages/rekindle/
	@echo "Python package: PYTHONPATH=$(PREFIX)/lib/python3/dist-packages (Debian's python3 searches /usr/lib/python3/dist-packages and /usr/local/lib/python3/dist-packages already)"

# The wheel from what `all` built (setup.py packs it; pip builds offline, without
# isolation, from the interpreter's own setuptools and wheel).
WHEEL_PYTHON ?= /usr/bin/python3
wheel: all
	@mkdir -p dist
	$(Q)REKINDLE_BUILD=$(BUILD) $(WHEEL_PYTHON) -m pip wheel --quiet --no-build-isolation --no-deps --no-index -w dist .
	@ls -1 dist/rekindle-$(VERSION)-*.whl

clean:
	rm -rf build

help:
	@sed -n '1,/^$$/p' Makefile

.PRECIOUS: $(BUILD)/obj/%.o $(BUILD)/obj/examples/%.o $(BUILD)/obj/bench/%.o $(BUILD)/obj/tests/%.o $(BUILD)/obj/fuzz/%.o
-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
