/*
 * real.c - the libc calls behind the interposed names (`real`, filled by dlsym(RTLD_NEXT) once)
 * and the re-entry depth: a call the shim or the provider makes goes to libc, never back into
 * the shim.
 */
#include <dlfcn.h>

#include "shim.h"

struct real_fns real;
__thread int shim_depth __attribute__((tls_model("initial-exec")));

static pthread_once_t real_once = PTHREAD_ONCE_INIT;

#define LOAD(name) real.name = (__typeof__(real.name))dlsym(RTLD_NEXT, #name)

static void real_load(void)
{
	LOAD(socket), LOAD(bind), LOAD(connect), LOAD(close), LOAD(shutdown);
	LOAD(listen), LOAD(accept), LOAD(accept4), LOAD(sendfile), LOAD(sendfile64);
	LOAD(close_range), LOAD(closefrom), LOAD(eventfd);
	LOAD(dup), LOAD(dup2), LOAD(dup3), LOAD(fcntl), LOAD(ioctl);
	LOAD(setsockopt), LOAD(getsockopt), LOAD(getpeername);
	LOAD(send), LOAD(sendto), LOAD(sendmsg), LOAD(sendmmsg);
	LOAD(recv), LOAD(recvfrom), LOAD(recvmsg), LOAD(recvmmsg);
	LOAD(read), LOAD(write), LOAD(readv), LOAD(writev);
	LOAD(poll), LOAD(ppoll), LOAD(select), LOAD(pselect);
	LOAD(epoll_create), LOAD(epoll_create1), LOAD(epoll_ctl), LOAD(epoll_wait), LOAD(epoll_pwait);
	LOAD(fork), LOAD(syscall), LOAD(splice);
}

void shim_real_init(void)
{
	if (unlikely(!real.close))
		pthread_once(&real_once, real_load);
}
