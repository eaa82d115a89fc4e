/*
 * test/lib/clockshift.c -- an LD_PRELOAD library that moves the wall clock
 * of a process by a fixed offset, for the calendar sweep (test/calendar.sh)
 * and the instruction counts (bench/callgrind.sh).
 *
 *   IDEM_CLOCK_OFFSET=SECONDS   add SECONDS (signed) to the wall clock
 *   IDEM_CLOCK_START=EPOCH      the wall clock reads EPOCH when the process
 *                               starts (the offset is taken then), and runs
 *                               on from there
 *
 * Only the wall clock moves: CLOCK_REALTIME (and its coarse variant),
 * gettimeofday(), time(), timespec_get(); the monotonic clocks, sleeps,
 * timers and waits are the real ones.  Forked children keep their parent's
 * offset; a program started by exec reads the environment again (with
 * IDEM_CLOCK_START it starts at EPOCH again).
 *
 * Why not libfaketime: it wraps the blocking calls (epoll_wait, poll,
 * select, ...) and, while inside one, answers the real clock.  A signal
 * handler that reads the clock while the process waits, as PostgreSQL's
 * timeout handler does when SIGALRM interrupts a lock wait, then sees the
 * real time: with the clock moved forwards, the timeout never seems due,
 * and lock_timeout and statement_timeout never fire.  Nothing here wraps
 * a blocking call.
 *
 * Build: gcc -shared -fPIC -O2 -o clockshift.so clockshift.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long shift_ns;		/* added to the real wall clock */
static int	(*real_clock_gettime) (clockid_t, struct timespec *);

__attribute__((constructor))
static void
clockshift_init(void)
{
	const char *offset = getenv("IDEM_CLOCK_OFFSET");
	const char *start = getenv("IDEM_CLOCK_START");
	struct timespec now;

	real_clock_gettime = (int (*) (clockid_t, struct timespec *))
		dlsym(RTLD_NEXT, "clock_gettime");
	if (start != NULL && *start != '\0' && real_clock_gettime != NULL &&
		real_clock_gettime(CLOCK_REALTIME, &now) == 0)
		shift_ns = strtoll(start, NULL, 10) * 1000000000LL -
			((long long) now.tv_sec * 1000000000LL + now.tv_nsec);
	else if (offset != NULL)
		shift_ns = strtoll(offset, NULL, 10) * 1000000000LL;
}

static void
shift(struct timespec *ts)
{
	long long	ns = (long long) ts->tv_sec * 1000000000LL + ts->tv_nsec + shift_ns;

	ts->tv_sec = (time_t) (ns / 1000000000LL);
	ts->tv_nsec = (long) (ns % 1000000000LL);
	if (ts->tv_nsec < 0)
	{
		ts->tv_nsec += 1000000000L;
		ts->tv_sec -= 1;
	}
}

static int
wall(struct timespec *ts)
{
	if (real_clock_gettime == NULL)
		return -1;
	if (real_clock_gettime(CLOCK_REALTIME, ts) != 0)
		return -1;
	shift(ts);
	return 0;
}

int
clock_gettime(clockid_t clk, struct timespec *ts)
{
	if (real_clock_gettime == NULL)
		return -1;
	if (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)
	{
		int			rc = real_clock_gettime(clk, ts);

		if (rc == 0)
			shift(ts);
		return rc;
	}
	return real_clock_gettime(clk, ts);
}

int
gettimeofday(struct timeval *tv, void *tz)
{
	struct timespec ts;

	(void) tz;
	if (wall(&ts) != 0)
		return -1;
	tv->tv_sec = ts.tv_sec;
	tv->tv_usec = ts.tv_nsec / 1000;
	return 0;
}

time_t
time(time_t *t)
{
	struct timespec ts;

	if (wall(&ts) != 0)
		return (time_t) -1;
	if (t != NULL)
		*t = ts.tv_sec;
	return ts.tv_sec;
}

int
timespec_get(struct timespec *ts, int base)
{
	if (base != TIME_UTC || wall(ts) != 0)
		return 0;
	return base;
}
