#include "util/cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

void cli_die(const char *fmt, ...)
{
	va_list ap;

	fputs(cli_name, stderr);
	fputs(": ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}
