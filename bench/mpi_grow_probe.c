/*
 * bench/mpi_grow_probe.c - what Open MPI (4.1, no ULFM) does when a job that lost a member
 * tries to grow in place (docs/LAUNCHER.md, "Why a job grows by a relaunch"): run under
 * `mpirun --enable-recovery -n 3` (bench/grow_probe.sh). The last rank dies after a
 * barrier; the survivors make a communicator of themselves (MPI_Comm_create_group, which
 * only they take part in), spawn one newcomer over it, merge the intercommunicator and
 * allreduce over the merged world. With the argument "die" the newcomer dies right after
 * MPI_Init, before the merge: then the survivors' MPI_Intercomm_merge never returns.
 * Prints each call's result and time.
 */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
int main(int argc,char**argv){
  int prov; MPI_Init_thread(&argc,&argv,MPI_THREAD_SERIALIZED,&prov);
  MPI_Comm parent; MPI_Comm_get_parent(&parent);
  if(parent!=MPI_COMM_NULL){ /* a newcomer */
    if(argc>1&&strcmp(argv[1],"die")==0) raise(SIGKILL);
    MPI_Comm m; MPI_Intercomm_merge(parent,1,&m); int r,s; MPI_Comm_rank(m,&r);MPI_Comm_size(m,&s);
    int one=1,sum=0; MPI_Allreduce(&one,&sum,1,MPI_INT,MPI_SUM,m);
    printf("child: merged rank %d of %d, sum %d\n",r,s,sum); fflush(stdout);
    MPI_Comm_free(&m); MPI_Finalize(); return 0; }
  int rank,size; MPI_Comm_rank(MPI_COMM_WORLD,&rank);MPI_Comm_size(MPI_COMM_WORLD,&size);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD,MPI_ERRORS_RETURN);
  MPI_Barrier(MPI_COMM_WORLD);
  if(rank==size-1) raise(SIGKILL);
  sleep(1);
  MPI_Group wg,sg; MPI_Comm_group(MPI_COMM_WORLD,&wg); int ex[1]={size-1}; MPI_Group_excl(wg,1,ex,&sg);
  double t0=now(); MPI_Comm surv; int rc=MPI_Comm_create_group(MPI_COMM_WORLD,sg,7,&surv);
  printf("rank %d: create_group rc %d in %.1f ms\n",rank,rc,now()-t0); fflush(stdout);
  MPI_Comm_set_errhandler(surv,MPI_ERRORS_RETURN);
  MPI_Comm_set_errhandler(MPI_COMM_SELF,MPI_ERRORS_RETURN);
  char *cargv[]={argc>1?argv[1]:"ok",NULL}; MPI_Comm inter; int errs[1];
  t0=now(); rc=MPI_Comm_spawn(argv[0],cargv,1,MPI_INFO_NULL,0,surv,&inter,errs);
  printf("rank %d: spawn rc %d err %d in %.1f ms\n",rank,rc,errs[0],now()-t0); fflush(stdout);
  if(rc==MPI_SUCCESS){ MPI_Comm m; t0=now(); MPI_Intercomm_merge(inter,0,&m); int one=1,sum=0; MPI_Allreduce(&one,&sum,1,MPI_INT,MPI_SUM,m);
    int r,s;MPI_Comm_rank(m,&r);MPI_Comm_size(m,&s);printf("rank %d: merged rank %d of %d sum %d in %.1f ms\n",rank,r,s,sum,now()-t0);fflush(stdout);}
  MPI_Finalize(); return 0; }
