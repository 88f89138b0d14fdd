#include "util/cli.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "util/compiler.h"
#include "util/log.h"

void cli_die(const char *fmt, ...)
{
	char line[2048];
	va_list ap;
	int n;

	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	/* One line, whatever an image put into it (log.h, log_one_line). */
	log_one_line(line, MIN((size_t)n, sizeof(line) - 1));
	fprintf(stderr, "%s: %s\n", cli_name, line);
	exit(1);
}
