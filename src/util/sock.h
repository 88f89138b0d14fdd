/* Unix listening sockets with the checks every daemon socket needs. */
#ifndef VBLK_SOCK_H
#define VBLK_SOCK_H

#include <stddef.h>
#include <sys/socket.h>

/*
 * Bind and listen on a unix stream socket at path (non-blocking,
 * close-on-exec).  A live listener already there is an error; a stale
 * socket file (nobody accepts) is replaced; any other file is left alone.
 * Returns the fd, or -errno with one line for the user in err; nothing is
 * left behind on failure.  Any thread.
 */
int sock_listen_unix(const char *path, char *err, size_t errlen);

/*
 * Bind and listen on a TCP address, "HOST:PORT", "[HOST6]:PORT" or
 * ":PORT" (every address, IPv6 and IPv4), numeric only (non-blocking,
 * close-on-exec, SO_REUSEADDR).  Returns the fd, or -errno with one line
 * for the user in err (a port in use, an address of no interface here).
 * Any thread.
 */
int sock_listen_tcp(const char *addr, char *err, size_t errlen);

/*
 * Attach nfds file descriptors to mh as one SCM_RIGHTS control message,
 * built in cbuf (cbuflen at least CMSG_SPACE(nfds * sizeof(int))).  With
 * nfds 0 mh is left without control data.  Returns 0, or -EINVAL if cbuf
 * is too small.  Any thread.
 */
int sock_msg_set_fds(struct msghdr *mh, void *cbuf, size_t cbuflen,
		     const int *fds, unsigned nfds);

#endif
