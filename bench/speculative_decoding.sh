#!/bin/sh
# bench/speculative_decoding.sh — speculative decoding on two mini-GPTs trained on fortunes: a
# small draft proposes, a larger target verifies. Trains both with train_gpt (unless their
# checkpoints are already in WORK), then runs `dissect generate` on a few prompts, the target
# alone and with the draft at several γ, greedy and sampled, and prints one table row per setting:
# acceptance rate, target forwards per token and tokens/s (all new tokens over the whole
# generation, prefill included: each prompt's fastest of REPEATS runs, summed over the prompts),
# and, greedy, whether every speculative output is the target's own, id for id.
#
#   cmake --preset release -B build/rel
#   cmake --build build/rel --target train_gpt dissect_cli -j1
#   bench/speculative_decoding.sh [BUILD] [WORK]      # defaults build/rel, BUILD/speculative
#
# The machine's load moves tokens/s; the acceptance rates and forwards do not (fixed seeds).
set -eu
repo=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$repo/build/rel}
work=${2:-$build/speculative}
train_gpt=$build/examples/train_gpt
dissect=$build/tools/dissect/dissect
for tool in "$train_gpt" "$dissect"; do
  if [ ! -x "$tool" ]; then
    echo "speculative_decoding.sh: $tool is missing; build it first:" >&2
    echo "  cmake --preset release -B $build && cmake --build $build --target train_gpt dissect_cli -j1" >&2
    exit 2
  fi
done
mkdir -p "$work"

# Target: D 128, 4 layers (0.8 M parameters); draft: D 32, 1 layer (16 k): 600 steps each, the
# same data, context and byte vocabulary (train_gpt's defaults otherwise).
train() {  # name, then train_gpt's model flags
  name=$1
  shift
  if [ ! -f "$work/$name.safetensors" ]; then
    "$train_gpt" "$@" --context 64 --batch 16 --steps 600 --eval-every 100 --svg none \
      --checkpoint "$work/$name.safetensors" | tail -n 2
  fi
}
train target --d-model 128 --layers 4 --heads 4
train draft --d-model 32 --layers 1 --heads 2

prompts="The|A man|Q:|You will|Life is"
repeats=${REPEATS:-5}
new_tokens=56
settings="0:0 0:2 0:4 0:6 0.8:0 0.8:2 0.8:4 0.8:6"  # temperature:γ, γ 0 the target alone

# One generation: "temperature gamma prompt# tokens seconds proposed accepted target_forwards ids".
measure() {  # temperature gamma prompt_number prompt
  set -- "$1" "$2" "$3" "$4" generate "$work/target.safetensors" --prompt "$4" --ids --seed 7 \
    --max-new-tokens "$new_tokens" --temperature "$1"
  if [ "$2" -gt 0 ]; then set -- "$@" --draft "$work/draft.safetensors" --gamma "$2"; fi
  temperature=$1 gamma=$2 number=$3
  shift 4
  out=$("$dissect" "$@")
  ids=$(printf '%s\n' "$out" | head -n 1 | tr -d ' ')
  if [ "$gamma" -gt 0 ]; then
    line=$(printf '%s\n' "$out" | grep '^speculative ')
    draft=$(printf '%s\n' "$out" | grep '^draft ')
    counts=$(echo "$draft" | sed 's/^draft *\([0-9]*\) of \([0-9]*\) .*; \([0-9]*\) target forwards.*/\2 \1 \3/')
  else
    line=$(printf '%s\n' "$out" | grep '^total ')
    counts="0 0 $(echo "$line" | awk '{print $2}')"
  fi
  echo "$temperature $gamma $number $(echo "$line" | awk '{print $2, $5}') $counts $ids"
}

# Every setting once per prompt, then again, `repeats` times: a burst of load on this shared
# machine then hits every setting alike, and each setting keeps its fastest run of each prompt.
runs=$work/runs.txt
: >"$runs"
r=0
while [ "$r" -lt "$repeats" ]; do
  number=0
  old_ifs=$IFS
  IFS='|'
  for prompt in $prompts; do
    IFS=$old_ifs
    number=$((number + 1))
    for setting in $settings; do
      measure "${setting%%:*}" "${setting##*:}" "$number" "$prompt" >>"$runs"
    done
    IFS='|'
  done
  IFS=$old_ifs
  r=$((r + 1))
done

echo "| decoding | temperature | γ | acceptance | target forwards per token | tokens/s | speed-up | output = target's |"
echo "|---|---|---|---|---|---|---|---|"
awk '
  { key = $1 " " $2 " " $3
    if (!(key in best) || $5 < best[key]) best[key] = $5
    tokens[key] = $4; proposed[key] = $6; accepted[key] = $7; forwards[key] = $8; ids[key] = $9
    if (!($1 " " $2 in seen)) { seen[$1 " " $2] = 1; order[++n] = $1 " " $2 }
    prompts[$3] = 1 }
  END {
    for (i = 1; i <= n; ++i) {
      split(order[i], s, " "); t = s[1]; g = s[2]
      T = 0; S = 0; P = 0; A = 0; F = 0; same = 1
      for (p in prompts) {
        key = t " " g " " p
        T += tokens[key]; S += best[key]; P += proposed[key]; A += accepted[key]; F += forwards[key]
        if (ids[key] != ids[t " 0 " p]) same = 0
      }
      rate = T / S
      if (g == 0) {
        base[t] = rate
        printf "| target alone | %s | – | – | 1.00 | %.0f | 1.00 | – |\n", t, rate
      } else {
        printf "| speculative | %s | %d | %.1f %% (%d of %d) | %.2f | %.0f | %.2f | %s |\n", t, g,
          100 * A / P, A, P, F / T, rate, rate / base[t],
          t == 0 ? (same ? "yes, every id" : "NO") : "–"
      }
    }
  }' "$runs"
