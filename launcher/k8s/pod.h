/* pod.h — plait launch in a Kubernetes pod: the gang of pods meets at pod 0's
 * store, every pod computes the job's rank map alike, and each runs its own
 * ranks (pod.c). What the pod's environment holds is launcher/k8s/k8s_env.h. */
#ifndef PLAIT_LAUNCHER_POD_H
#define PLAIT_LAUNCHER_POD_H

#include <stdbool.h>

/* True in a pod of an Indexed Job or JobSet (JOB_COMPLETION_INDEX is set). */
bool pod_is_kubernetes(void);

/* Rendezvous, placement and this pod's ranks, until they end. Returns the
 * pod's exit code: 0 done, 75 preempted after a checkpoint, 76 (restart the
 * gang) when a pod never came by the deadline, a peer was lost or one of this
 * pod's ranks failed, 1 for a broken pod environment, plan or a store that
 * refused this pod's secret. */
int pod_launch(void);

#endif
