#!/usr/bin/env bash
# Paired, alternating: per rep, every (server, mode) once; order reversed on even reps.
reps=${1:-5}
cells=("before plain" "after plain" "before tls" "after tls")
echo "# rep server mode wall_s cpu_us_per_req"
for r in $(seq $reps); do
    order=("${cells[@]}")
    if ((r % 2 == 0)); then order=(); for ((i=${#cells[@]}-1;i>=0;i--)); do order+=("${cells[$i]}"); done; fi
    for c in "${order[@]}"; do
        set -- $c
        echo "$r $1 $2 $(/tmp/tb/run1.sh /tmp/vblkd-$1 $2)"
    done
done
