#!/bin/sh
# SPDX-License-Identifier: (GPL-2.0-only OR BSD-3-Clause)
#
# Compiles gpuvm_trace.bpf.c into the object the Go build embeds
# (gpuvm_trace.bpf.o, checked in so that building gpuvm needs no clang)
# and records what it was made from in bpf.sum. Run it through
# `go generate ./internal/bpftrace`. Needs clang and llvm-strip (Debian:
# clang llvm), and the headers of libbpf-dev and linux-libc-dev.
#
# gen-bpf.sh OUTDIR writes only OUTDIR/gpuvm_trace.bpf.o (the test that
# checks the checked-in object is up to date uses it).
set -eu
cd "$(dirname "$0")"
out=${1:-.}
clang=${CLANG:-clang}
strip=${LLVM_STRIP:-llvm-strip}
# The BPF target has no multiarch include path of its own: asm/ptrace.h
# (struct pt_regs) is x86-64's, as the uprobes read amd64 registers. BTF's
# line info names the source file: -fdebug-prefix-map makes that
# ./gpuvm_trace.bpf.c wherever the tree is, so the object is reproducible.
"$clang" -O2 -g -Wall -Werror -target bpf -D__TARGET_ARCH_x86 \
	-I/usr/include/x86_64-linux-gnu -fdebug-prefix-map="$(pwd)"=. \
	-c gpuvm_trace.bpf.c -o "$out/gpuvm_trace.bpf.o"
# Drop DWARF, keep BTF (.BTF, .BTF.ext): the loader needs it for the maps.
"$strip" -g "$out/gpuvm_trace.bpf.o"
if [ "$out" = . ]; then
	{
		echo "# Written by gen-bpf.sh: what gpuvm_trace.bpf.o was built from."
		echo "source $(sha256sum gpuvm_trace.bpf.c | cut -d' ' -f1)"
		echo "object $(sha256sum gpuvm_trace.bpf.o | cut -d' ' -f1)"
		echo "clang $("$clang" --version | head -n1)"
	} >bpf.sum
fi
