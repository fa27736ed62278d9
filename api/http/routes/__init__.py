"""One router per resource: /jobs, /jobs/{uuid}/events and input, /files, /mmi, /schedules, the ops endpoints."""
