# Sourced by tests: X.509 credentials for vblkd's --nbd ...,tls=x509:DIR
# and its clients, in the directory layout qemu-nbd and nbdkit use.
#
#   x509_make PKI CLI CN [--dns NAME]... [--ip ADDR]...
#
# PKI gets a CA (ca-cert.pem, ca-key.pem) and a server certificate for
# those names and addresses (server-cert.pem, server-key.pem): the server's
# directory.  CLI gets the CA alone: a client's (libnbd's
# tls-certificates=CLI, nbdinfo, qemu-img).  Needs certtool (gnutls-bin).
# Returns non-zero if certtool fails.
x509_make() {
    local pki=$1 cli=$2 cn=$3 alt=""
    shift 3
    while (($#)); do
        case $1 in
        --dns) alt+="dns_name = $2"$'\n' ;;
        --ip) alt+="ip_address = $2"$'\n' ;;
        *) return 2 ;;
        esac
        shift 2
    done
    mkdir -p "$pki" "$cli" || return 1
    printf 'cn = vblkd test CA\nca\ncert_signing_key\n' >"$pki/ca.info"
    printf 'cn = %s\n%stls_www_server\nencryption_key\nsigning_key\n' "$cn" "$alt" >"$pki/server.info"
    (cd "$pki" &&
        certtool --generate-privkey >ca-key.pem 2>/dev/null &&
        certtool --generate-self-signed --load-privkey ca-key.pem --template ca.info \
            --outfile ca-cert.pem >/dev/null 2>&1 &&
        certtool --generate-privkey >server-key.pem 2>/dev/null &&
        certtool --generate-certificate --load-ca-certificate ca-cert.pem --load-ca-privkey ca-key.pem \
            --load-privkey server-key.pem --template server.info --outfile server-cert.pem \
            >/dev/null 2>&1) &&
        cp "$pki/ca-cert.pem" "$cli/"
}
