/* The address other hosts dial to reach this process (grpod.advertise_host), and a check that a name resolves. */
#ifndef GRPO_COMMON_NETADDR_H
#define GRPO_COMMON_NETADDR_H

#include <stddef.h>

/* `value` (grpod.advertise_host) as the address peers dial: the IPv4 address of the interface of that name (e.g.
 * ib0: the same key names each host's own address), else the value itself (a host name or an address). "" gives
 * "" (no address named: peers dial the host name, binds take every interface). 0, or -1 with err (an interface
 * without an IPv4 address). */
int net_advertise_address(const char *value, char *out, size_t len, char *err, size_t errlen);

/* 0 when `host` resolves here, or -1 with err naming the host, this host's name, the resolver's reason and `key`
 * (the setting that names the address to dial). */
int net_check_resolves(const char *host, const char *key, char *err, size_t errlen);

#endif
