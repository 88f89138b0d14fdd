/* Parsing of user-supplied numbers, shared by the command-line tools. */
#ifndef VBLK_PARSE_H
#define VBLK_PARSE_H

#include <stdint.h>

/* "4096", "4k", "512M", "1G", "2T" (binary units) into bytes.  Returns 0
 * or -EINVAL (not a size, or it overflows 64 bits).  Any thread. */
int parse_size(const char *s, uint64_t *out);

#endif
