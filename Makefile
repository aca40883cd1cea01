# cumulo — one plain Makefile. Every src/<module>/*.c is part of libcumulo.a
# (except src/cli, which makes the binary). ISA-specific kernel files are
# named *_avx2.c, *_avx512.c, *_amx.c, *_neon.c and get their own flags; the default
# build runs on any x86-64 or arm64 machine (runtime dispatch; never tuned to the build host).
#
#   make demo      install what is missing, build, run the demo
#   make test      install what is missing, build, run every test
#   make           build ./cumulo
#   make newcomer  the README's commands in a fresh Debian 12 minbase root (scripts/newcomer.sh; slow)

SHARED ?= $(abspath $(CURDIR)/../shared)
export CUMULO_SHARED ?= $(SHARED)

CC ?= cc
UNAME_S := $(shell uname -s)
UNAME_M := $(shell uname -m)
# MPI (issue 18): `make MPI=1` builds build-mpi/cumulo with `cumulo mpi`
# (src/mpi/, compiled with $(MPICC): OpenMPI's or MPICH's mpicc, e.g.
# MPICC=mpicc.mpich BUILD=build-mpich). The default build has no MPI at all;
# `make test` also builds the MPI variant when $(MPICC) is there.
MPICC ?= mpicc
ifeq ($(MPI),1)
  BUILD ?= build-mpi
  override CC := $(MPICC)
endif
BUILD ?= build
PKGS := libmicrohttpd libcjson libsodium libpcre2-8 libcurl

# Homebrew's curl is keg-only: let pkg-config see its libcurl.pc on macOS.
ifeq ($(shell uname -s),Darwin)
  BREW_CURL_PC := $(shell brew --prefix curl 2>/dev/null)/lib/pkgconfig
  export PKG_CONFIG_PATH := $(BREW_CURL_PC):$(PKG_CONFIG_PATH)
endif
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

OPT ?= -O2
WARN := -Wall -Wextra -Wpedantic -Wno-unused-parameter -Werror
ifeq ($(UNAME_S),Darwin)
  OSDEF := -D_DARWIN_C_SOURCE
else
  OSDEF := -D_GNU_SOURCE
endif
CFLAGS ?=
CFLAGS += -std=c11 $(OPT) -g $(WARN) $(OSDEF) -fno-strict-aliasing -Isrc $(PKG_CFLAGS) $(SAN)
LDLIBS += $(PKG_LIBS) -lm -lpthread $(SAN)

# ISA flags: only the files that carry the ISA in their name get them.
ifeq ($(UNAME_M),x86_64)
  ISA_AVX2 := -mavx2 -mfma -mf16c
  ISA_AVX512 := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mfma -mf16c -mavx2
  ISA_AMX := $(ISA_AVX512) -mamx-tile -mamx-int8
  ISA_SRCS_EXCLUDE := %_neon.c
else ifneq ($(filter arm64 aarch64,$(UNAME_M)),)
  ISA_NEON := -march=armv8.2-a+dotprod+fp16
  ISA_SRCS_EXCLUDE := %_avx2.c %_avx512.c %_amx.c
endif

LIB_SRCS := $(filter-out $(ISA_SRCS_EXCLUDE),$(wildcard src/*/*.c))
LIB_SRCS := $(filter-out src/cli/% src/mpi/%,$(LIB_SRCS))
CLI_SRCS := $(wildcard src/cli/*.c)
ifeq ($(MPI),1)
  CLI_SRCS := $(filter-out src/cli/cmd_mpi_none.c,$(CLI_SRCS)) $(wildcard src/mpi/*.c)
endif
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
# The Vulkan shaders as SPIR-V in a generated C file (no glslc: no shaders,
# and the binary says it has no GPU backend).
GLSLC ?= $(shell command -v glslc 2>/dev/null)
VK_SHADERS := $(wildcard src/gpu/shaders/*)
LIB_OBJS += $(BUILD)/gen/vk_spv.o
CLI_OBJS := $(CLI_SRCS:%.c=$(BUILD)/%.o)
TEST_SRCS := $(wildcard tests/unit/test_*.c)
TEST_BINS := $(TEST_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
DEPS := $(LIB_OBJS:.o=.d) $(CLI_OBJS:.o=.d) $(TEST_BINS:=.d)

.PHONY: all deps demo test test-quick mpi-if-there newcomer check clean fuzz fuzz-long asan tsan neon-test format format-check bench kbench bbench tp-bench real-7b install deb-test

all: cumulo

cumulo: $(BUILD)/cumulo
	@[ "$(MPI)" = 1 ] || ln -sf $(BUILD)/cumulo cumulo

$(BUILD)/cumulo: $(CLI_OBJS) $(BUILD)/libcumulo.a
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJS) $(BUILD)/libcumulo.a $(LDLIBS)

$(BUILD)/libcumulo.a: $(LIB_OBJS)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/gen/vk_spv.c: $(VK_SHADERS) scripts/spv2c.sh
	sh scripts/spv2c.sh "$(GLSLC)" $@ src/gpu/shaders
$(BUILD)/gen/vk_spv.o: $(BUILD)/gen/vk_spv.c
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ISA_AVX2) -MMD -MP -c -o $@ $<
$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ISA_AVX512) -MMD -MP -c -o $@ $<
$(BUILD)/%_amx.o: %_amx.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ISA_AMX) -MMD -MP -c -o $@ $<
$(BUILD)/%_neon.o: %_neon.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(ISA_NEON) -MMD -MP -c -o $@ $<
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libcumulo.a tests/unit/test.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -MMD -MP -o $@ $< $(BUILD)/libcumulo.a $(LDLIBS)

tests: $(TEST_BINS)
# test_api_stops makes cm_strdup fail on demand (its out-of-memory paths)
# (GNU ld / lld; macOS's linker has no --wrap: that part is left out there)
ifeq ($(UNAME_S),Darwin)
$(BUILD)/tests/test_api_stops: CFLAGS += -DCM_TEST_NO_WRAP
else
$(BUILD)/tests/test_api_stops: LDLIBS += -Wl,--wrap=cm_strdup
endif

# Kernel micro-benchmark (GB/s of weights per type and ISA); not a test.
$(BUILD)/bench/kbench: bench/kbench.c $(BUILD)/libcumulo.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcumulo.a $(LDLIBS)
kbench: $(BUILD)/bench/kbench
	$(BUILD)/bench/kbench

# The float prefill gemms (f16, bf16) at one shape, GFLOP/s by thread CPU time; not a test.
$(BUILD)/bench/fgbench: bench/fgbench.c $(BUILD)/libcumulo.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcumulo.a $(LDLIBS)
# Where each AMX gemm starts to win against the gemm it takes over from; not a test.
$(BUILD)/bench/amxcross: bench/amxcross.c $(BUILD)/libcumulo.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcumulo.a $(LDLIBS)
$(BUILD)/bench/tunebench: bench/tunebench.c $(BUILD)/libcumulo.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcumulo.a $(LDLIBS)

# Batched-decode kernel benchmark (Q4_0 1B-llama shapes, B = 1..32 rows); not a test.
$(BUILD)/bench/bbench: bench/bbench.c $(BUILD)/libcumulo.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -o $@ $< $(BUILD)/libcumulo.a $(LDLIBS)
bbench: $(BUILD)/bench/bbench
	$(BUILD)/bench/bbench

# Tensor-parallel benchmark (1B-class Q8_0 model written to $$TMPDIR once); not a test.
$(BUILD)/bench/tp_bench: bench/tp_bench.c tests/unit/tp_model.h tests/unit/fixtures.h $(BUILD)/libcumulo.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(BUILD)/libcumulo.a $(LDLIBS)
tp-bench: $(BUILD)/bench/tp_bench
	$(BUILD)/bench/tp_bench $(TP_BENCH_ARGS)

# The all-reduce's CPU cost per op (two members over loopback); not a test.
.PHONY: tp-coll-bench
$(BUILD)/bench/tp_coll_bench: bench/tp_coll_bench.c tests/unit/fixtures.h $(BUILD)/libcumulo.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< $(BUILD)/libcumulo.a $(LDLIBS)
tp-coll-bench: $(BUILD)/bench/tp_coll_bench
	$(BUILD)/bench/tp_coll_bench $(TP_COLL_BENCH_ARGS)

# NEON kernels on this x86 machine: cross-compile only what the kernel test
# needs (base, os, tensor, kernels; no system libraries) statically, and run
# it under qemu-user. Only *_neon.c files get the NEON ISA flags, as in the
# native arm64 build. tests/sh/neon.sh runs this as part of `make test`.
NEON_CC ?= aarch64-linux-gnu-gcc
NEON_QEMU ?= qemu-aarch64
NEON_ISA := -march=armv8.2-a+dotprod+fp16
NEON_CFLAGS := -std=c11 -O2 $(WARN) -D_GNU_SOURCE -fno-strict-aliasing -Isrc -Itests/unit
NEON_SRCS := $(filter-out %_avx2.c %_avx512.c %_amx.c,$(wildcard src/base/*.c src/os/*.c src/tensor/*.c src/kernels/*.c))
NEON_OBJS := $(NEON_SRCS:%.c=build-neon/%.o)
build-neon/%_neon.o: %_neon.c
	@mkdir -p $(dir $@)
	$(NEON_CC) $(NEON_CFLAGS) $(NEON_ISA) -MMD -MP -c -o $@ $<
build-neon/%.o: %.c
	@mkdir -p $(dir $@)
	$(NEON_CC) $(NEON_CFLAGS) -MMD -MP -c -o $@ $<
build-neon/test_kernels_simd build-neon/test_kernels build-neon/test_kernels_invariant: build-neon/%: tests/unit/%.c tests/unit/test.h $(NEON_OBJS)
	$(NEON_CC) $(NEON_CFLAGS) -static -o $@ $< $(NEON_OBJS) -lm -lpthread
# -cpu max has dotprod (the NEON table is tested); cortex-a57 lacks it (dispatch
# must fall back to scalar without executing a NEON-dotprod instruction).
neon-test: build-neon/test_kernels_simd build-neon/test_kernels build-neon/test_kernels_invariant
	CUMULO_EXPECT_ISA=neon $(NEON_QEMU) -cpu max build-neon/test_kernels_simd
	$(NEON_QEMU) -cpu cortex-a57 build-neon/test_kernels_simd
	CUMULO_TEST_WRAPPER="$(NEON_QEMU) -cpu max" $(NEON_QEMU) -cpu max build-neon/test_kernels
	$(NEON_QEMU) -cpu max build-neon/test_kernels_invariant

# Install missing system packages (apt on Debian/Ubuntu, brew on macOS); a no-op when all is there.
deps:
	@sh scripts/setup.sh

demo: deps
	@$(MAKE) --no-print-directory cumulo
	@sh scripts/demo.sh

# The README's test command: everything a newcomer and CI run.
test: deps
	@$(MAKE) --no-print-directory cumulo tests
	@$(MAKE) --no-print-directory mpi-if-there
	@sh tests/run.sh

# The MPI variant (build-mpi/cumulo, tests/sh/mpi.sh) when an mpicc is installed.
mpi-if-there:
	@if command -v $(MPICC) >/dev/null 2>&1; then $(MAKE) --no-print-directory MPI=1 BUILD=build-mpi cumulo; \
	else echo "no $(MPICC): build-mpi/cumulo not built (tests/sh/mpi.sh reports n/a)"; fi

# DeepSeek-R1-Distill-Qwen-7B (qwen2, ~4.7 GB) against llama.cpp: greedy ids,
# probabilities and a chat turn (not part of `make test`; slow on 2 cores).
# NLC=folder of node-llama-cpp (default $$TMPDIR/nlc); CUMULO_7B=PATH uses a local copy.
real-7b: cumulo
	@sh scripts/real_7b.sh

# Tests without the dependency check (for quick iteration).
test-quick: cumulo tests mpi-if-there
	@sh tests/run.sh

# The README's commands as a newcomer runs them: a debootstrapped Debian 12
# minbase root, a clean clone of this branch, with and without ../shared
# (root, network to the Debian mirror; about an hour). Not part of `make test`.
newcomer:
	@sh scripts/newcomer.sh

# Sanitizer builds of the whole suite, in their own build folders.
asan:
	@$(MAKE) --no-print-directory BUILD=build-asan CC=clang OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer" cumulo tests
	@CUMULO_TIMEOUT_SCALE=4 CUMULO_BIN=build-asan/cumulo CUMULO_TESTBIN=build-asan/tests sh tests/run.sh
tsan:
	@$(MAKE) --no-print-directory BUILD=build-tsan CC=clang OPT=-O1 SAN="-fsanitize=thread" cumulo tests
	@CUMULO_TIMEOUT_SCALE=4 CUMULO_BIN=build-tsan/cumulo CUMULO_TESTBIN=build-tsan/tests sh tests/run.sh

# libFuzzer targets: fuzz/fuzz_*.c, built against an instrumented library.
FUZZ_SRCS := $(wildcard fuzz/fuzz_*.c)
FUZZ_BINS := $(FUZZ_SRCS:fuzz/%.c=build-fuzz/%)
FUZZ_SECONDS ?= 20
build-fuzz/libcumulo.a: $(LIB_SRCS) $(wildcard src/*/*.h)
	@$(MAKE) --no-print-directory BUILD=build-fuzz CC=clang OPT=-O1 \
	  SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" build-fuzz/libcumulo.a-inner
build-fuzz/libcumulo.a-inner: $(LIB_OBJS)
	@rm -f build-fuzz/libcumulo.a
	ar rcs build-fuzz/libcumulo.a $^
build-fuzz/fuzz_%: fuzz/fuzz_%.c build-fuzz/libcumulo.a
	clang -std=c11 -O1 -g $(OSDEF) -Isrc $(PKG_CFLAGS) -fsanitize=fuzzer,address,undefined \
	  -fno-sanitize-recover=undefined -o $@ $< build-fuzz/libcumulo.a $(PKG_LIBS) -lm -lpthread
fuzz: $(FUZZ_BINS)
	@sh fuzz/run.sh $(FUZZ_SECONDS)
fuzz-long:
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=600

format:
	clang-format -i $$(sh tools/format_files.sh)
format-check:
	@sh tools/format_check.sh

# `make install` (PREFIX=/usr/local, DESTDIR for packaging): the binary, the
# demo (runs the installed cumulo) and the docs.
PREFIX ?= /usr/local
install: cumulo
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/cumulo $(DESTDIR)$(PREFIX)/share/doc/cumulo
	install -m 755 $(BUILD)/cumulo $(DESTDIR)$(PREFIX)/bin/cumulo
	install -m 755 scripts/demo.sh $(DESTDIR)$(PREFIX)/share/cumulo/demo.sh
	install -m 644 README.md docs/DESIGN.md docs/PROTOCOL.md $(DESTDIR)$(PREFIX)/share/doc/cumulo/

# A Debian package built from the committed tree (dpkg-buildpackage in a
# temporary copy), installed, run (--version, the demo, a service unit) and
# removed: scripts/deb_test.sh (root; not part of `make test`: it rebuilds).
deb-test:
	@sh scripts/deb_test.sh

clean:
	rm -rf build build-asan build-tsan build-fuzz build-neon build-mpi cumulo

-include $(DEPS)
-include $(NEON_OBJS:.o=.d)
