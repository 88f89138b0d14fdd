/* cli_: what the command-line programs (vblkd, vblkctl, vblk-bench) share. */
#ifndef VBLK_CLI_H
#define VBLK_CLI_H

/* The program's name, the prefix of its messages ("vblkd"): each program
 * defines it, so that what it says does not depend on argv[0]. */
extern const char cli_name[];

/* One line on stderr, "NAME: message", and exit 1: for every user
 * mistake.  Any thread (it ends the process). */
void cli_die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#endif
