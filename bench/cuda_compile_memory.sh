#!/usr/bin/env bash
# nvcc's wall time and peak resident memory per CUDA translation unit (one NAME_cuda_<dtype>_hd<D>.cu
# variant: the forward, the backward kernels, the token program and the mods of one encoding),
# for the example specs, dtypes, head dims and architectures asked for. Each unit compiles alone
# (no other nvcc at the same time), under a memory cap and a time limit, with the flags of the
# build (examples/CMakeLists.txt: -O3 --expt-relaxed-constexpr, APE_CUDA_SM90A at sm_90a).
# Peak memory is GNU time's maximum resident set size, which covers nvcc's children (cicc, ptxas);
# time is CPU seconds (user + system of nvcc and its children: what the unit costs, whatever else
# runs on the machine) and the wall time beside it.
#
#   bench/cuda_compile_memory.sh [--apec build/tools/apec] [--archs 80,90a] [--dtypes bf16,f16,f32]
#       [--dims 32,64,128] [--encodings a,b,...] [--cap-gb 12] [--timeout 600]
#       [--md bench/results/cuda_compile_memory.md] [--csv bench/results/cuda_compile_memory.csv]
#
# Defaults: every example spec the CUDA template takes, bf16 and f32 at head dims 64 and 128,
# sm_80 and sm_90a. A unit over the cap or the limit is reported as such (and the run goes on).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
apec=$root/build/tools/apec
archs=80,90a dtypes=bf16,f32 dims=64,128 encodings="" cap_gb=12 limit=600
md=$root/bench/results/cuda_compile_memory.md csv=$root/bench/results/cuda_compile_memory.csv
while [ $# -gt 0 ]; do
  case $1 in
    --apec) apec=$2; shift 2 ;;
    --archs) archs=$2; shift 2 ;;
    --dtypes) dtypes=$2; shift 2 ;;
    --dims) dims=$2; shift 2 ;;
    --encodings) encodings=$2; shift 2 ;;
    --cap-gb) cap_gb=$2; shift 2 ;;
    --timeout) limit=$2; shift 2 ;;
    --md) md=$2; shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$nvcc" ] || { echo "no nvcc" >&2; exit 2; }
[ -x "$apec" ] || { echo "no apec at $apec (scripts/build.sh apec)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "needs GNU time (/usr/bin/time: apt-get install time)" >&2; exit 2; }
if [ -z "$encodings" ]; then
  for spec in "$root"/examples/encodings/*.mlir; do
    grep -q 'ape\.attention_transition' "$spec" && continue  # CPU only
    encodings+="${encodings:+,}$(basename "$spec" .mlir)"
  done
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "encoding,dtype,head_dim,arch,status,cpu_seconds,peak_mib,wall_seconds" >"$csv"
for enc in ${encodings//,/ }; do
  "$apec" "$root/examples/encodings/$enc.mlir" -o "$work/$enc" --emit=cuda --cuda-dtypes="$dtypes" \
    --cuda-head-dims="$dims" --expect-name "$enc" >/dev/null || { echo "apec failed on $enc" >&2; exit 1; }
  for arch in ${archs//,/ }; do
    flags=(-gencode "arch=compute_${arch},code=sm_${arch}")
    [ "$arch" = 90a ] && flags+=(-DAPE_CUDA_SM90A)
    for dtype in ${dtypes//,/ }; do
      for dim in ${dims//,/ }; do
        unit=$work/$enc/${enc}_cuda_${dtype}_hd${dim}.cu
        out=$( (ulimit -v $((cap_gb * 1024 * 1024)); /usr/bin/time -f "TIME %U %S %M %e" timeout "$limit" \
          "$nvcc" -c -O3 -std=c++17 --expt-relaxed-constexpr "${flags[@]}" -I"$root/kernels/include" \
          -I"$work/$enc" "$unit" -o "$work/unit.o") 2>&1)
        rc=$?
        read -r user sys kib wall < <(echo "$out" | grep -oE '^TIME [0-9.]+ [0-9.]+ [0-9]+ [0-9.]+' | tail -1 | cut -d' ' -f2-)
        secs=$(awk -v u="${user:-0}" -v s="${sys:-0}" 'BEGIN {printf "%.1f", u + s}')
        status=ok
        if [ $rc -eq 124 ]; then status=timeout
        elif [ $rc -ne 0 ]; then
          if echo "$out" | grep -qiE 'out of memory|std::bad_alloc|cannot allocate|Killed'; then status=over-cap
          else status=error; echo "$out" | tail -5 >&2; fi
        fi
        printf '%s,%s,%s,%s,%s,%s,%s,%s\n' "$enc" "$dtype" "$dim" "sm_$arch" "$status" "$secs" \
          "$(( ${kib:-0} / 1024 ))" "${wall:-}" | tee -a "$csv"
      done
    done
  done
done

# The report: one row per encoding, the largest unit per architecture.
{
  echo "# nvcc time and peak memory per CUDA translation unit"
  echo
  echo "Measured $(date -u +%Y-%m-%d) on $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB, $("$nvcc" --version | tail -1 | sed 's/^Build //'), host $(g++ --version | head -1)."
  echo "Command: \`bench/cuda_compile_memory.sh --archs $archs --dtypes $dtypes --dims $dims --cap-gb $cap_gb --timeout $limit\`"
  echo "(commit $(git -C "$root" rev-parse --short HEAD)). One unit at a time; peak = GNU time's maximum RSS (nvcc and its children), time = CPU seconds of nvcc and its children;"
  echo "every unit: \`${csv#$root/}\`. The bar (issue 31): at most 4 GiB and 1 minute per unit."
  echo
  echo "| encoding | units | largest peak (MiB) | slowest (CPU s) | the slowest unit | over the bar |"
  echo "| --- | --- | --- | --- | --- | --- |"
  tail -n +2 "$csv" | awk -F, '
    { n[$1]++; if ($7 > peak[$1]) peak[$1] = $7
      if ($6 + 0 > slow[$1]) { slow[$1] = $6 + 0; which[$1] = $2 " hd" $3 " " $4 }
      if ($5 != "ok" || $7 > 4096 || $6 > 60) bad[$1] = bad[$1] " " $2 "/hd" $3 "/" $4 ":" $5
      if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
    END { for (i = 1; i <= k; i++) { e = order[i]
            printf "| %s | %d | %d | %.1f | %s | %s |\n", e, n[e], peak[e], slow[e], which[e],
                   bad[e] == "" ? "none" : bad[e] } }'
} >"$md"
cat "$md"
