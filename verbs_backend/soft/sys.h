/* Direct system calls for the provider's per-message socket I/O.
 *
 * Why not libc's sendto/recvmsg: under the shim the process always has a second thread (the
 * provider's), so every libc socket call is a cancellation point that switches the thread's
 * cancellation type twice (two atomic read-modify-writes), and the call resolves through the
 * shim's own exported sendto (the interposer, which then finds shim_depth set and calls libc).
 * Every call here is non-blocking (MSG_DONTWAIT, or an eventfd), so it must not be a
 * cancellation point anyway: the provider holds locks around it. On x86-64 and AArch64 the
 * system call is made inline; elsewhere libc's function is called.
 *
 * Each returns what the system call returns: a count >= 0, or -errno (errno is not touched
 * on the inline path).
 */
#ifndef DG_SOFT_SYS_H
#define DG_SOFT_SYS_H

#include <errno.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define DG_SYS_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define DG_SYS_SANITIZED 1
#endif

/* Sanitized builds keep libc's calls: their interceptors check the buffers and (TSan) see the
 * happens-before an eventfd or a socket carries between threads. */
#if defined(__x86_64__) && !defined(DG_SYS_SANITIZED)
static inline long dg_sys6(long nr, long a, long b, long c, long d, long e, long f)
{
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}
#define DG_SYS_INLINE 1
#elif defined(__aarch64__) && !defined(DG_SYS_SANITIZED)
static inline long dg_sys6(long nr, long a, long b, long c, long d, long e, long f)
{
	register long x8 __asm__("x8") = nr;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	register long x3 __asm__("x3") = d;
	register long x4 __asm__("x4") = e;
	register long x5 __asm__("x5") = f;
	__asm__ volatile("svc 0"
			 : "+r"(x0)
			 : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
			 : "memory");
	return x0;
}
#define DG_SYS_INLINE 1
#else
#define DG_SYS_INLINE 0
#endif

#if DG_SYS_INLINE
static inline ssize_t dg_sys_sendto(int fd, const void *buf, size_t len, int flags,
				    const struct sockaddr *to, socklen_t tolen)
{
	return dg_sys6(SYS_sendto, fd, (long)buf, (long)len, flags, (long)to, tolen);
}
static inline ssize_t dg_sys_sendmsg(int fd, const struct msghdr *m, int flags)
{
	return dg_sys6(SYS_sendmsg, fd, (long)m, flags, 0, 0, 0);
}
static inline ssize_t dg_sys_recvmsg(int fd, struct msghdr *m, int flags)
{
	return dg_sys6(SYS_recvmsg, fd, (long)m, flags, 0, 0, 0);
}
static inline ssize_t dg_sys_recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from,
				      socklen_t *fromlen)
{
	return dg_sys6(SYS_recvfrom, fd, (long)buf, (long)len, flags, (long)from, (long)fromlen);
}
static inline int dg_sys_sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	return (int)dg_sys6(SYS_sendmmsg, fd, (long)v, n, flags, 0, 0);
}
static inline int dg_sys_recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	return (int)dg_sys6(SYS_recvmmsg, fd, (long)v, n, flags, 0, 0);
}
static inline ssize_t dg_sys_read(int fd, void *buf, size_t len)
{
	return dg_sys6(SYS_read, fd, (long)buf, (long)len, 0, 0, 0);
}
static inline ssize_t dg_sys_write(int fd, const void *buf, size_t len)
{
	return dg_sys6(SYS_write, fd, (long)buf, (long)len, 0, 0, 0);
}
#else
static inline long dg_sys_ret(long r)
{
	return r < 0 ? -errno : r;
}
static inline ssize_t dg_sys_sendto(int fd, const void *buf, size_t len, int flags,
				    const struct sockaddr *to, socklen_t tolen)
{
	return dg_sys_ret(sendto(fd, buf, len, flags, to, tolen));
}
static inline ssize_t dg_sys_sendmsg(int fd, const struct msghdr *m, int flags)
{
	return dg_sys_ret(sendmsg(fd, m, flags));
}
static inline ssize_t dg_sys_recvmsg(int fd, struct msghdr *m, int flags)
{
	return dg_sys_ret(recvmsg(fd, m, flags));
}
static inline ssize_t dg_sys_recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from,
				      socklen_t *fromlen)
{
	return dg_sys_ret(recvfrom(fd, buf, len, flags, from, fromlen));
}
static inline int dg_sys_sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	return (int)dg_sys_ret(sendmmsg(fd, v, n, flags));
}
static inline int dg_sys_recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	return (int)dg_sys_ret(recvmmsg(fd, v, n, flags, NULL));
}
static inline ssize_t dg_sys_read(int fd, void *buf, size_t len)
{
	return dg_sys_ret(read(fd, buf, len));
}
static inline ssize_t dg_sys_write(int fd, const void *buf, size_t len)
{
	return dg_sys_ret(write(fd, buf, len));
}
#endif

#endif
