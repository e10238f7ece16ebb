#include "netaddr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"
#include "common/config_key_names.h"

int net_advertise_address(const char *value, char *out, size_t len, char *err, size_t errlen)
{
    if (len)
        out[0] = 0;
    if (!value || !value[0])
        return 0;
    if (strlen(value) >= IF_NAMESIZE || if_nametoindex(value) == 0) {
        snprintf(out, len, "%s", value); /* a host name or an address */
        return 0;
    }
    struct ifaddrs *all = NULL;
    if (getifaddrs(&all) != 0)
        return error_set(err, errlen, KEY_grpod_advertise_host " %s: cannot list the interfaces: %s", value,
                         strerror(errno));
    int found = 0;
    for (struct ifaddrs *i = all; i && !found; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && strcmp(i->ifa_name, value) == 0) {
            char a[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)i->ifa_addr)->sin_addr, a, sizeof a);
            snprintf(out, len, "%s", a);
            found = 1;
        }
    freeifaddrs(all);
    if (!found)
        return error_set(err, errlen, KEY_grpod_advertise_host " %s: the interface has no IPv4 address", value);
    return 0;
}

int net_check_resolves(const char *host, const char *key, char *err, size_t errlen)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc == 0) {
        freeaddrinfo(res);
        return 0;
    }
    char me[256] = "";
    if (gethostname(me, sizeof me - 1) != 0)
        snprintf(me, sizeof me, "?");
    return error_set(err, errlen,
                     "the host name '%s' does not resolve on host %s (%s): name an address the other hosts can "
                     "reach with %s (an address, a resolvable name or an interface such as eth0)",
                     host, me, gai_strerror(rc), key);
}
