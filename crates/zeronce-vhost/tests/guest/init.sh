#!/bin/sh
# init (PID 1) of the User Mode Linux guest of the real-guest test.
#
# The guest's root is the host's / over hostfs, read-write: this script writes only to
# the guest's own tmpfs (mounted over /tmp inside the guest; the host's /tmp is not
# touched). It loads virtio_balloon, then answers one-line commands read from its console
# (the test writes them to UML's stdin); every answer line starts with "@guest ".
#
#   meminfo       -> @guest meminfo <MemTotal kB> <MemFree kB>
#   fill <MiB>    -> writes <MiB> MiB into /tmp/fill          -> @guest filled
#   drop          -> deletes /tmp/fill                          -> @guest dropped
#   report-order <n> -> sets mm/page_reporting's order (11: reporting off) -> @guest order <n>
#   halt          -> powers the guest off
#
# UML_MODULES (kernel command line, passed to init as an environment variable) names the
# module tree; by default the Debian user-mode-linux package's.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t tmpfs -o size=200m tmpfs /tmp

say() { echo "@guest $*"; }

modules=${UML_MODULES:-/usr/lib/uml/modules/$(uname -r)}
if insmod "$modules/kernel/drivers/virtio/virtio_balloon.ko"; then
    say "balloon-loaded"
else
    say "balloon-load-failed"
fi
say "ready"

while read -r cmd arg; do
    case "$cmd" in
        meminfo)
            total=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
            free=$(awk '/^MemFree:/ {print $2}' /proc/meminfo)
            say "meminfo $total $free"
            ;;
        fill)
            dd if=/dev/zero of=/tmp/fill bs=1M count="$arg" 2>/dev/null
            sync
            say "filled"
            ;;
        drop)
            rm -f /tmp/fill
            say "dropped"
            ;;
        report-order)
            echo "$arg" > /sys/module/page_reporting/parameters/page_reporting_order
            say "order $(cat /sys/module/page_reporting/parameters/page_reporting_order)"
            ;;
        halt)
            say "halting"
            break
            ;;
        "")
            ;;
        *)
            say "unknown $cmd"
            ;;
    esac
done

halt -f 2>/dev/null
poweroff -f 2>/dev/null
echo o > /proc/sysrq-trigger
