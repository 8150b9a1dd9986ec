#!/usr/bin/env bash
# Refresh rule 7's IP-reputation deny list from a feed and reload the edge; run it from the
# operator's scheduler (cron, a systemd timer), for example daily.
#
#   refresh-ip-reputation.sh FEED_URL [FEED_URL...]
#
# Each feed is a text list with one IPv4/IPv6 address or CIDR block at the start of a line;
# anything after it (";" or "#" comments, as in Spamhaus DROP or FireHOL lists) is ignored.
# The new list replaces ip-sets/reputation-deny.txt only when every feed was fetched, the list
# is not empty and `nginx -t` accepts the configuration with it; otherwise the old list stays
# and the script exits non-zero. Environment: EDGE_CONF_DIR (default /etc/tradecore-edge),
# EDGE_PREFIX (default /var/lib/tradecore-edge), NGINX (default nginx).
set -euo pipefail

conf_dir=${EDGE_CONF_DIR:-/etc/tradecore-edge}
prefix=${EDGE_PREFIX:-/var/lib/tradecore-edge}
nginx_bin=${NGINX:-nginx}
list="$conf_dir/ip-sets/reputation-deny.txt"

if [ "$#" -eq 0 ]; then
    echo "usage: $0 FEED_URL [FEED_URL...]" >&2
    exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for url in "$@"; do
    curl --fail --silent --show-error --max-time 60 --location "$url" >>"$work/feeds"
    echo >>"$work/feeds"
done

# Keep the leading address or CIDR of each line; drop everything else.
{
    echo "# Rule 7 IP-reputation deny list, written by refresh-ip-reputation.sh on $(date -u +%FT%TZ)"
    grep -Eo '^[[:space:]]*([0-9]{1,3}(\.[0-9]{1,3}){3}(/[0-9]{1,2})?|[0-9A-Fa-f:]*:[0-9A-Fa-f:.]+(/[0-9]{1,3})?)' \
        "$work/feeds" | tr -d '[:blank:]' | sort -u || true
} >"$work/list"

entries=$(grep -vc '^#' "$work/list" || true)
if [ "$entries" -eq 0 ]; then
    echo "refresh-ip-reputation: the feeds gave no address; keeping $list" >&2
    exit 1
fi

cp "$list" "$work/previous"
cp "$work/list" "$list.new"
mv -f "$list.new" "$list"
if ! "$nginx_bin" -t -q -p "$prefix" -e "$prefix/logs/error.log" -c "$conf_dir/nginx.conf"; then
    mv -f "$work/previous" "$list"
    echo "refresh-ip-reputation: nginx -t refused the new list; the previous one is restored" >&2
    exit 1
fi
"$nginx_bin" -p "$prefix" -e "$prefix/logs/error.log" -c "$conf_dir/nginx.conf" -s reload
echo "refresh-ip-reputation: $entries entries loaded"
