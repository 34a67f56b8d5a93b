#!/bin/bash
# The first-round CCM (main 1ef0161, the code measured on kube-apiserver on 2026-11-23) under
# today's `ccm bench`: it knows no --cert-dir, so this makes a CA + serving pair where the
# bench's scraper reads it and passes it as --tls-cert-file / --tls-private-key-file.
args=()
for a in "$@"; do
  case "$a" in
    --cert-dir=*)
      dir="${a#--cert-dir=}"; mkdir -p "$dir"
      openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
        -subj /CN=bench-ca -keyout "$dir/ca.key" -out "$dir/ca.crt" 2>/dev/null
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=127.0.0.1 \
        -keyout "$dir/cloud-controller-manager.key" -out "$dir/leaf.csr" 2>/dev/null
      printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$dir/ext"
      openssl x509 -req -in "$dir/leaf.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
        -days 1 -extfile "$dir/ext" -out "$dir/leaf.crt" 2>/dev/null
      cat "$dir/leaf.crt" "$dir/ca.crt" > "$dir/cloud-controller-manager.crt"
      args+=("--tls-cert-file=$dir/cloud-controller-manager.crt" "--tls-private-key-file=$dir/cloud-controller-manager.key");;
    *) args+=("$a");;
  esac
done
exec "${OLD_CCM:-/work/target-old/release/ccm}" "${args[@]}"
