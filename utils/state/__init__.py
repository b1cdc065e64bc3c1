"""How a run is resumed and where its files go: checkpoints written atomically and read safely
(checkpoint), where the run stands (training_state), which checkpoint a run folder resumes
(timeline), what of it a run can take (resume), the run folder (run_folder), stop signals
(signals), cross-validation results (folds). Machinery: not edited for a new task."""
