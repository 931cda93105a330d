/* The pause container of scripts/cluster.sh's and scripts/kind.sh's nodes: sleeps, reaps
   orphaned children, exits 0 on SIGINT or SIGTERM. Built static, so the image holds only it. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
static void down(int s) { (void)s; exit(0); }
static void reap(int s) { (void)s; while (waitpid(-1, NULL, WNOHANG) > 0) {} }
int main(void) {
  struct sigaction a;
  memset(&a, 0, sizeof a);
  a.sa_handler = down;
  if (sigaction(SIGINT, &a, NULL) < 0 || sigaction(SIGTERM, &a, NULL) < 0) return 1;
  a.sa_handler = reap;
  a.sa_flags = SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &a, NULL) < 0) return 2;
  for (;;) pause();
}
