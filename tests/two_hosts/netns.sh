#!/usr/bin/env bash
# Two "hosts" on one machine: network namespaces NAME-a and NAME-b joined by a
# veth pair, 10.77.0.1/24 in NAME-a and 10.77.0.2/24 in NAME-b, interface veth0
# on both sides. Every pair lives wholly inside its own namespaces, so pairs of
# other names (parallel runs) reuse the same addresses without colliding.
#
#   netns.sh up NAME          create (replacing a pair of that name left over)
#   netns.sh shape NAME RATE  limit each direction to RATE (tc units: 1gbit, 5gbit)
#   netns.sh unshape NAME     remove the limit
#   netns.sh down NAME        delete; nothing to delete is not an error
#   netns.sh check            exit 0 if this machine can create namespaces
#
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2.
set -euo pipefail

ADDR_A=10.77.0.1
ADDR_B=10.77.0.2
PREFIX_LEN=24
DEV=veth0

usage() {
	sed -n '2,13p' "$0" >&2
	exit 2
}

check_name() {
	# ip netns names become file names under /run/netns.
	[[ "$1" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,40}$ ]] || {
		echo "netns.sh: bad name '$1'" >&2
		exit 2
	}
}

down() {
	local ns
	for ns in "$1-a" "$1-b"; do
		# Killing what still runs inside lets the namespace go; deleting the
		# namespace also deletes its end of the veth pair, and with it the other.
		if ip netns pids "$ns" >/dev/null 2>&1; then
			ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
			ip netns del "$ns" 2>/dev/null || true
		fi
	done
}

up() {
	local name=$1
	down "$name"
	# Half a pair is worse than none: undo everything if any step fails.
	trap 'down "$name"' ERR
	ip netns add "$name-a"
	ip netns add "$name-b"
	ip link add "$DEV" netns "$name-a" type veth peer name "$DEV" netns "$name-b"
	ip -n "$name-a" addr add "$ADDR_A/$PREFIX_LEN" dev "$DEV"
	ip -n "$name-b" addr add "$ADDR_B/$PREFIX_LEN" dev "$DEV"
	local ns
	for ns in "$name-a" "$name-b"; do
		ip -n "$ns" link set lo up
		ip -n "$ns" link set "$DEV" up
	done
	trap - ERR
	echo "$name-a $ADDR_A"
	echo "$name-b $ADDR_B"
}

shape() {
	local name=$1 rate=$2 ns
	for ns in "$name-a" "$name-b"; do
		# A burst of 1 ms at the rate (at least 64 KiB) lets TCP fill the link
		# without turning the bucket into a second, unshaped link.
		tc -n "$ns" qdisc replace dev "$DEV" root tbf rate "$rate" burst "$(burst_bytes "$rate")" latency 50ms
	done
}

burst_bytes() {
	local rate=$1 bits
	case "$rate" in
	*gbit) bits=$((${rate%gbit} * 1000000000)) ;;
	*mbit) bits=$((${rate%mbit} * 1000000)) ;;
	*) bits=1000000000 ;;
	esac
	local bytes=$((bits / 8 / 1000))
	echo $((bytes > 65536 ? bytes : 65536))
}

unshape() {
	local ns
	for ns in "$1-a" "$1-b"; do
		tc -n "$ns" qdisc del dev "$DEV" root 2>/dev/null || true
	done
}

check() {
	local probe="netns-check-$$"
	[ "$(id -u)" = 0 ] || {
		echo "not root" >&2
		exit 1
	}
	command -v ip >/dev/null || {
		echo "iproute2 (ip) is not installed" >&2
		exit 1
	}
	ip netns add "$probe" || {
		echo "ip netns add failed" >&2
		exit 1
	}
	ip netns del "$probe"
}

case "${1:-}" in
up | down | unshape)
	[ $# = 2 ] || usage
	check_name "$2"
	"$1" "$2"
	;;
shape)
	[ $# = 3 ] || usage
	check_name "$2"
	[[ "$3" =~ ^[0-9]+[mg]bit$ ]] || {
		echo "netns.sh: RATE must look like 500mbit or 1gbit" >&2
		exit 2
	}
	shape "$2" "$3"
	;;
check)
	check
	;;
*) usage ;;
esac
