#!/usr/bin/env bash
# "Hosts" on one machine: network namespaces NAME-a, NAME-b, ... with addresses
# 10.77.0.1/24, 10.77.0.2/24, ... on interface veth0. Two hosts with no delay are
# joined by one veth pair; more hosts meet on a bridge in a namespace NAME-hub;
# with a round-trip time, NAME-hub holds delay_hub (delay_hub.cc) instead, which
# passes every frame on RTT_MS/2 later each way. Every set lives wholly inside its
# own namespaces, so sets of other names (parallel runs) reuse the addresses.
#
#   netns.sh up NAME [HOSTS [RTT_MS]]  create (replacing a set of that name left over);
#                                      HOSTS 2 to 8 (default 2), RTT_MS default 0
#   netns.sh shape NAME RATE           limit what each host sends to RATE (1gbit, 500mbit)
#   netns.sh unshape NAME              remove the limit
#   netns.sh down NAME                 delete; nothing to delete is not an error
#   netns.sh check [bridge] [delay]    exit 0 if this machine can create namespaces (and
#                                      bridges, and run delay_hub)
#
# TCP_WMEM_MAX=BYTES in the environment of `up` raises the hosts' net.ipv4.tcp_wmem
# limit (4 MiB by default): one TCP connection keeps at most that much in flight, which
# caps it at TCP_WMEM_MAX / RTT on a long link.
#
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; a delay also needs g++
# (delay_hub is built on first use, into build/two_hosts/ of the repository).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
SUBNET=10.77.0
PREFIX_LEN=24
DEV=veth0
HOST_LETTERS=(a b c d e f g h)
# Frames the hub holds for one host beyond this are dropped, as a router's full
# buffer drops them: far above a 1 Gbit/s link's bandwidth-delay product at 100 ms.
HUB_QUEUE_LIMIT=$((64 << 20))

usage() {
	sed -n '2,22p' "$0" >&2
	exit 2
}

check_name() {
	# ip netns names become file names under /run/netns.
	[[ "$1" =~ ^[A-Za-z0-9][A-Za-z0-9_.-]{0,40}$ ]] || {
		echo "netns.sh: bad name '$1'" >&2
		exit 2
	}
}

namespaces_of() {
	local letter
	for letter in "${HOST_LETTERS[@]}"; do echo "$1-$letter"; done
	echo "$1-hub"
}

hosts_of() {
	local letter
	for letter in "${HOST_LETTERS[@]}"; do
		[ -e "/run/netns/$1-$letter" ] && echo "$1-$letter"
	done
	return 0
}

hub_log() {
	echo "${TMPDIR:-/tmp}/netns-$1-hub.log"
}

down() {
	local ns
	rm -f "$(hub_log "$1")"
	for ns in $(namespaces_of "$1"); do
		# Killing what still runs inside lets the namespace go; deleting the
		# namespace also deletes its end of the veth pair, and with it the other.
		if ip netns pids "$ns" >/dev/null 2>&1; then
			ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
			ip netns del "$ns" 2>/dev/null || true
		fi
	done
}

up() {
	local name=$1 hosts=$2 rtt_ms=$3 i ns
	local hub_binary=""
	# Built before anything is created, so that a failed build leaves nothing behind.
	if [ "$rtt_ms" != 0 ]; then
		hub_binary=$(build_delay_hub)
	fi
	down "$name"
	# Half a set is worse than none: undo everything if any step fails.
	trap 'down "$name"' ERR
	for ((i = 0; i < hosts; i++)); do
		ip netns add "$name-${HOST_LETTERS[i]}"
	done
	if [ "$hosts" = 2 ] && [ "$rtt_ms" = 0 ]; then
		ip link add "$DEV" netns "$name-a" type veth peer name "$DEV" netns "$name-b"
	else
		ip netns add "$name-hub"
		ip -n "$name-hub" link set lo up
		for ((i = 0; i < hosts; i++)); do
			ip link add "$DEV" netns "$name-${HOST_LETTERS[i]}" type veth peer name "h$i" netns "$name-hub"
			ip -n "$name-hub" link set "h$i" up
		done
		if [ "$rtt_ms" = 0 ]; then
			ip -n "$name-hub" link add br0 type bridge
			for ((i = 0; i < hosts; i++)); do
				ip -n "$name-hub" link set "h$i" master br0
			done
			ip -n "$name-hub" link set br0 up
		else
			start_delay_hub "$name" "$hub_binary" "$hosts" "$rtt_ms"
		fi
	fi
	for ((i = 0; i < hosts; i++)); do
		ns="$name-${HOST_LETTERS[i]}"
		ip -n "$ns" addr add "$SUBNET.$((i + 1))/$PREFIX_LEN" dev "$DEV"
		ip -n "$ns" link set lo up
		ip -n "$ns" link set "$DEV" up
		if [ -n "${TCP_WMEM_MAX:-}" ]; then
			ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_wmem="4096 16384 $TCP_WMEM_MAX"
		fi
	done
	trap - ERR
	for ((i = 0; i < hosts; i++)); do
		echo "$name-${HOST_LETTERS[i]} $SUBNET.$((i + 1))"
	done
}

build_delay_hub() {
	local source="$HERE/delay_hub.cc" binary="$REPO/build/two_hosts/delay_hub"
	if [ ! -x "$binary" ] || [ "$source" -nt "$binary" ]; then
		mkdir -p "$(dirname "$binary")"
		# Into a file of its own, then renamed: parallel runs may build at once.
		g++ -O2 -std=c++17 -Wall -Werror -o "$binary.$$" "$source" >&2
		mv -f "$binary.$$" "$binary"
	fi
	echo "$binary"
}

start_delay_hub() {
	local name=$1 binary=$2 hosts=$3 rtt_ms=$4 i log
	log=$(hub_log "$name")
	local ports=()
	for ((i = 0; i < hosts; i++)); do ports+=("h$i"); done
	# Runs inside NAME-hub, so that down's kill of the namespace's processes ends it.
	ip netns exec "$name-hub" setsid "$binary" "$((rtt_ms * 500))" "$HUB_QUEUE_LIMIT" "${ports[@]}" \
		</dev/null >"$log" 2>&1 &
	for ((i = 0; i < 100; i++)); do
		grep -q "^delay_hub: ready" "$log" 2>/dev/null && return 0
		kill -0 $! 2>/dev/null || break
		sleep 0.05
	done
	echo "netns.sh: delay_hub did not start:" >&2
	cat "$log" >&2
	return 1
}

shape() {
	local name=$1 rate=$2 ns
	for ns in $(hosts_of "$name"); do
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
	for ns in $(hosts_of "$1"); do
		tc -n "$ns" qdisc del dev "$DEV" root 2>/dev/null || true
	done
}

check() {
	local probe="netns-check-$$" need
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
	# What more than two hosts, or a delay, need: a bridge; delay_hub built, and
	# its AF_PACKET sockets opened (on lo, until timeout ends it).
	for need in "$@"; do
		case "$need" in
		bridge)
			ip -n "$probe" link add br0 type bridge || {
				ip netns del "$probe"
				echo "this kernel cannot make a bridge (ip link add type bridge failed)" >&2
				exit 1
			}
			;;
		delay)
			local binary="" said=""
			# timeout's status is not the verdict: what the hub said is.
			binary=$(build_delay_hub) || true
			[ -z "$binary" ] || said=$(ip netns exec "$probe" timeout -s TERM 1 "$binary" 0 1 lo lo 2>&1 || true)
			[[ "$said" == *"delay_hub: ready"* ]] || {
				ip netns del "$probe"
				echo "delay_hub cannot run here (g++ to build it, and AF_PACKET sockets)" >&2
				exit 1
			}
			;;
		*)
			ip netns del "$probe"
			echo "netns.sh check: unknown need '$need' (bridge, delay)" >&2
			exit 2
			;;
		esac
	done
	ip netns del "$probe"
}

case "${1:-}" in
up)
	[ $# -ge 2 ] && [ $# -le 4 ] || usage
	check_name "$2"
	hosts=${3:-2}
	rtt_ms=${4:-0}
	[[ "$hosts" =~ ^[2-8]$ ]] || {
		echo "netns.sh: HOSTS must be 2 to 8" >&2
		exit 2
	}
	[[ "$rtt_ms" =~ ^[0-9]{1,4}$ ]] || {
		echo "netns.sh: RTT_MS must be a whole number of milliseconds" >&2
		exit 2
	}
	up "$2" "$hosts" "$rtt_ms"
	;;
down | unshape)
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
	shift
	check "$@"
	;;
*) usage ;;
esac
