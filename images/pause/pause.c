/* The pod sandbox's pause process: hold the pod's namespaces, reap orphans, exit on a signal.
 * Built with `gcc -static -O2 -o pause pause.c` by images/pause/build.sh. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { _exit(128 + sig); }

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && argv[1][0] == '-' && argv[1][1] == 'v') {
        puts("taskherd pause 3.10");
        return 0;
    }
    if (getpid() != 1) fprintf(stderr, "pause: warning: not PID 1\n");
    struct sigaction term = {.sa_handler = on_term}, child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &term, NULL);
    sigaction(SIGTERM, &term, NULL);
    sigaction(SIGCHLD, &child, NULL);
    for (;;) pause();
    return 42;
}
