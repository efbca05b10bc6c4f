;;; gpusync-test.el --- ERT tests of gpusync.el against the sandbox server -*- lexical-binding: t -*-

;;; Commentary:

;; Run by ../test.sh in `emacs --batch', which starts a sandbox server, initialises a project and
;; sets GS_PROJECT, GS_REMOTE and GPUSYNC_BIN.  Each test starts its own daemon and stops it.
;; Waiting is event-driven: `gpusync-test--wait' runs the process loop (accept-process-output)
;; until a condition on an observable result holds (a file on the server, a buffer's text, a
;; notification).  GS_EMACS_SKIP_RUN=1 leaves out the tests that need the server-side launcher.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'gpusync)

;; Emacs's lock files (.#NAME, symlinks) and backups (NAME~) would be mirrored like any other file
;; (gpusync has no built-in ignore for them yet), and a lock file in a folder the server refuses
;; would raise its own error event: keep the tests about the files they write.
(setq create-lockfiles nil
      make-backup-files nil)

(defvar gpusync-test--project (file-name-as-directory (getenv "GS_PROJECT")))
(defvar gpusync-test--remote (file-name-as-directory (getenv "GS_REMOTE")))
(defvar gpusync-test--notes nil "Notifications, newest first: (LEVEL . MESSAGE).")

(defun gpusync-test--capture (message level)
  "Record MESSAGE at LEVEL, and echo it to the test log."
  (push (cons level message) gpusync-test--notes)
  (message "  notify %s %s" level message))

(defun gpusync-test--wait (seconds pred)
  "Run the process loop until PRED returns non-nil or SECONDS pass; return PRED's value."
  (let ((deadline (+ (float-time) seconds)) value)
    (while (and (not (setq value (funcall pred))) (< (float-time) deadline))
      (accept-process-output nil 0.02))
    value))

(defun gpusync-test--noted (regexp &optional level)
  "The first notification matching REGEXP (at LEVEL if given)."
  (seq-find (lambda (n) (and (string-match-p regexp (cdr n)) (or (null level) (eq (car n) level))))
            gpusync-test--notes))

(defun gpusync-test--read (file)
  "FILE's contents, or nil if it does not exist."
  (when (file-exists-p file)
    (with-temp-buffer (insert-file-contents-literally file) (buffer-string))))

(defun gpusync-test--buffer-text (name)
  "The text of buffer NAME, or \"\"."
  (if (get-buffer name) (with-current-buffer name (buffer-string)) ""))

(defun gpusync-test--daemon-pid ()
  "The daemon's pid, from the \"watching (daemon pid N)\" notification."
  (let ((note (gpusync-test--noted "watching (daemon pid \\([0-9]+\\))")))
    (and note (string-match "pid \\([0-9]+\\)" (cdr note))
         (string-to-number (match-string 1 (cdr note))))))

(defmacro gpusync-test--with-watch (&rest body)
  "Run BODY in the project with a running daemon whose events are followed; stop it after."
  (declare (indent 0))
  `(let ((default-directory gpusync-test--project)
         (gpusync-notify-function #'gpusync-test--capture)
         (gpusync-test--notes nil))
     (setf (gpusync--project-events (gpusync--project)) nil)
     (setq gpusync--last-run nil gpusync--run-active nil)
     (gpusync-watch)
     (should (gpusync-test--wait 60 (lambda () (gpusync-test--noted "watching (daemon pid"))))
     (should (gpusync-test--wait 10 (lambda () (and (process-live-p (gpusync--project-process (gpusync--project)))
                                                    (not (eq (gpusync--state) 'connecting))))))
     (unwind-protect (progn ,@body)
       (let ((pid (gpusync-test--daemon-pid)))
         (gpusync-stop-watching)
         (gpusync-test--wait 10 (lambda () (eq (gpusync--state) 'off)))
         ;; `gpusync watch --stop' returns before the daemon has exited and released its lock,
         ;; so the next test's `watch -d' could find it "already running": wait for the process.
         (when pid
           (gpusync-test--wait 10 (lambda () (not (process-attributes pid)))))))))

(ert-deftest gpusync-test/a-stop-says-what-it-left-unsent ()
  (should (equal (gpusync--stopped-message '((was_running . t) (unsent . 0) (unchecked . :false)))
                 "stopped watching"))
  (should (string-match-p "2 changes were not sent"
                          (gpusync--stopped-message '((was_running . t) (unsent . 2)))))
  (should (string-match-p "before every file"
                          (gpusync--stopped-message '((was_running . t) (unsent . 0) (unchecked . t)))))
  (should (equal (gpusync--stopped-message '((was_running . :false))) "no watch was running")))

(ert-deftest gpusync-test/saving-a-buffer-puts-it-on-the-server ()
  (gpusync-test--with-watch
    (should gpusync-mode)
    (with-current-buffer (find-file-noselect (expand-file-name "hello.py" gpusync-test--project))
      (erase-buffer)
      (insert "print(\"hello from emacs\")\n")
      (save-buffer)
      (kill-buffer))
    (should (gpusync-test--wait 15 (lambda () (equal (gpusync-test--read
                                                      (expand-file-name "hello.py" gpusync-test--remote))
                                                     "print(\"hello from emacs\")\n"))))
    (should (gpusync-test--wait 10 (lambda () (seq-find (lambda (ev) (and (equal (alist-get 'event ev) "synced")
                                                                           (equal (alist-get 'path ev) "hello.py")))
                                                         (gpusync--project-events (gpusync--project))))))
    (should (gpusync-test--wait 10 (lambda () (equal (gpusync-mode-line) " gpusync:up to date"))))
    (gpusync-push)
    (should (gpusync-test--wait 20 (lambda () (gpusync-test--noted "pushed: sent 0" :info))))
    (gpusync-status)
    (should (gpusync-test--wait 10 (lambda () (gpusync-test--noted "up_to_date, connected, 0 pending" :info))))))

(ert-deftest gpusync-test/a-conflict-is-a-warning-naming-the-file ()
  (gpusync-test--with-watch
    ;; The server holds a directory where we save a file: the directory is kept as a copy.
    (make-directory (expand-file-name "clash/sub" gpusync-test--remote) t)
    (with-temp-file (expand-file-name "clash" gpusync-test--project) (insert "a file\n"))
    (unwind-protect
        (progn
          (should (gpusync-test--wait 15 (lambda () (gpusync-test--noted "conflict on clash: .* kept as clash\\.gpusync-conflict-" :warning))))
          (should (string-prefix-p " gpusync:conflict clash" (gpusync-mode-line)))
          (should (gpusync-test--wait 15 (lambda () (equal (gpusync-test--read (expand-file-name "clash" gpusync-test--remote))
                                                           "a file\n"))))
          (should (string-match-p (regexp-quote " [1 conflict copy]") (gpusync-mode-line)))
          (gpusync-status)
          (should (gpusync-test--wait 10 (lambda () (gpusync-test--noted "clash (the server's copy is clash\\.gpusync-conflict-" :warning))))
          ;; An Emacs that starts after the conflict learns of it from status --json.
          (setf (gpusync--project-conflicts (gpusync--project)) nil)
          (gpusync-status)
          (should (gpusync-test--wait 10 (lambda () (string-match-p (regexp-quote " [1 conflict copy]") (gpusync-mode-line)))))
          (call-process gpusync-executable nil nil nil "status" "--ack" "--json")
          (gpusync-status)
          (should (gpusync-test--wait 10 (lambda () (not (string-match-p "conflict cop" (gpusync-mode-line)))))))
      (call-process gpusync-executable nil nil nil "status" "--ack" "--json")
      (delete-file (expand-file-name "clash" gpusync-test--project)))))

(ert-deftest gpusync-test/a-failed-upload-is-an-error-naming-the-file ()
  (gpusync-test--with-watch
    (unwind-protect
        (progn
          (make-directory (expand-file-name "ro" gpusync-test--project) t)
          (with-temp-file (expand-file-name "ro/a.txt" gpusync-test--project) (insert "a\n"))
          (should (gpusync-test--wait 15 (lambda () (gpusync-test--read (expand-file-name "ro/a.txt" gpusync-test--remote)))))
          ;; Replace the folder gpusync made with a link into /proc, where nothing can be created.
          (delete-directory (expand-file-name "ro" gpusync-test--remote) t)
          (make-symbolic-link "/proc/1" (directory-file-name (expand-file-name "ro" gpusync-test--remote)))
          (with-temp-file (expand-file-name "ro/b.txt" gpusync-test--project) (insert "b\n"))
          (should (gpusync-test--wait 15 (lambda () (gpusync-test--noted "error on ro/b.txt" :error))))
          (should (string-prefix-p " gpusync:error b.txt" (gpusync-mode-line)))
          ;; The daemon retries the upload every few seconds, and each retry sends the error again:
          ;; the user is told once.
          (should (gpusync-test--wait 30 (lambda () (>= (seq-count (lambda (ev) (and (equal (alist-get 'event ev) "error")
                                                                                        (equal (alist-get 'path ev) "ro/b.txt")))
                                                                     (gpusync--project-events (gpusync--project)))
                                                          2))))
          (should (= 1 (seq-count (lambda (n) (string-match-p "error on ro/b\\.txt" (cdr n))) gpusync-test--notes))))
      ;; Leave neither side broken for the next test (its run syncs first).
      (let ((link (directory-file-name (expand-file-name "ro" gpusync-test--remote))))
        (when (file-symlink-p link) (delete-file link)))
      (delete-directory (expand-file-name "ro" gpusync-test--project) t))))

(ert-deftest gpusync-test/doctor-lists-the-checks ()
  (let ((default-directory gpusync-test--project)
        (gpusync-notify-function #'gpusync-test--capture)
        (gpusync-test--notes nil))
    (gpusync-doctor)
    (should (gpusync-test--wait 30 (lambda () (gpusync-test--noted "doctor: [0-9]+ check"))))
    (should (string-match-p "^\\[ok  \\] " (gpusync-test--buffer-text "*gpusync-doctor*")))))

(ert-deftest gpusync-test/gpu-puts-the-summary-in-the-mode-line ()
  (let ((default-directory gpusync-test--project)
        (gpusync-notify-function #'gpusync-test--capture)
        (gpusync-test--notes nil))
    (setq gpusync--gpu nil)
    (gpusync-gpu)
    ;; this server may have no GPU: the summary then says so
    (should (gpusync-test--wait 30 (lambda () gpusync--gpu)))
    (should (string-match-p "^\\(GPU[0-9]\\|no GPUs\\)" gpusync--gpu))
    (should (string-match-p (regexp-quote gpusync--gpu) (gpusync-mode-line)))
    (setq gpusync--gpu nil)))

(ert-deftest gpusync-test/run-fills-the-log-buffer ()
  (skip-unless (not (equal (getenv "GS_EMACS_SKIP_RUN") "1")))
  (let ((default-directory gpusync-test--project)
        (gpusync-notify-function #'gpusync-test--capture)
        (gpusync-test--notes nil))
    (setq gpusync--last-run nil)
    (gpusync-run nil "cpu=2" '("sh" "-c" "echo \"hello from rank $RANK of $WORLD_SIZE\""))
    (should (gpusync-test--wait 60 (lambda () gpusync--last-run)))
    (let ((name (format "*gpusync-logs %s*" gpusync--last-run)))
      (should (gpusync-test--wait 60 (lambda () (let ((text (gpusync-test--buffer-text name)))
                                                  (and (string-match-p "hello from rank 0 of 2" text)
                                                       (string-match-p "hello from rank 1 of 2" text))))))
      (should (gpusync-test--wait 30 (lambda () (string-match-p "ended: exit 0" (gpusync-test--buffer-text name)))))
      (should-not gpusync--run-active)
      (should (with-current-buffer name (derived-mode-p 'gpusync-log-mode))))
    ;; Without a run id, the newest run's logs.
    (gpusync-logs)
    (should (gpusync-test--wait 30 (lambda () (let ((text (gpusync-test--buffer-text "*gpusync-logs latest*")))
                                                (and (string-match-p "hello from rank 1 of 2" text)
                                                     (string-match-p "ended: exit 0" text))))))))

(ert-deftest gpusync-test/run-asks-for-a-config-job-and-gpus ()
  (skip-unless (not (equal (getenv "GS_EMACS_SKIP_RUN") "1")))
  (let ((default-directory gpusync-test--project)
        (gpusync-notify-function #'gpusync-test--capture)
        (gpusync-test--notes nil)
        (config (expand-file-name ".gpusync/config" gpusync-test--project))
        offered)
    (unless (string-match-p "\\[job \"hi\"\\]" (gpusync-test--read config))
      (write-region "\n[job \"hi\"]\n    command = echo \"job hi on rank $RANK\"\n" nil config t))
    (should (equal (gpusync-jobs) '("hi" "train")))
    (setq gpusync--last-run nil)
    ;; Answer the prompts as a user would: the job "hi", on 2 CPU ranks.
    (cl-letf (((symbol-function 'completing-read)
               (lambda (_prompt collection &rest _) (setq offered collection) "hi"))
              ((symbol-function 'read-string) (lambda (&rest _) "cpu=2")))
      (call-interactively #'gpusync-run))
    (should (member "hi" offered))
    (should (gpusync-test--wait 60 (lambda () gpusync--last-run)))
    (let ((name (format "*gpusync-logs %s*" gpusync--last-run)))
      (should (gpusync-test--wait 60 (lambda () (let ((text (gpusync-test--buffer-text name)))
                                                  (and (string-match-p "job hi on rank 0" text)
                                                       (string-match-p "job hi on rank 1" text)
                                                       (string-match-p "ended: exit 0" text)))))))))

(ert-deftest gpusync-test/stop-run-ends-a-running-job ()
  (skip-unless (not (equal (getenv "GS_EMACS_SKIP_RUN") "1")))
  (let ((default-directory gpusync-test--project)
        (gpusync-notify-function #'gpusync-test--capture)
        (gpusync-test--notes nil))
    (setq gpusync--last-run nil)
    (gpusync-run nil "cpu=1" '("sh" "-c" "echo started; exec sleep 600"))
    (should (gpusync-test--wait 60 (lambda () gpusync--run-active)))
    (let ((name (format "*gpusync-logs %s*" gpusync--last-run)))
      (should (gpusync-test--wait 30 (lambda () (string-match-p "started" (gpusync-test--buffer-text name)))))
      (gpusync-stop-run)
      (should (gpusync-test--wait 30 (lambda () (gpusync-test--noted (concat "stopped run " gpusync--last-run) :info))))
      (should (gpusync-test--wait 30 (lambda () (string-match-p "ended: exit" (gpusync-test--buffer-text name)))))
      (should (gpusync-test--wait 10 (lambda () (gpusync-test--noted "was stopped" :warning))))
      (should-not (gpusync-test--noted "ended with exit code" :error)))))

;;;; The second project, reached through the WAN simulator (../test-lib.sh)

(defvar gpusync-test--slow (and (getenv "GS_SLOW_PROJECT") (file-name-as-directory (getenv "GS_SLOW_PROJECT"))))
(defvar gpusync-test--slow-remote (and (getenv "GS_SLOW_REMOTE") (file-name-as-directory (getenv "GS_SLOW_REMOTE"))))

(defun gpusync-test--wansim (&rest args)
  "Tell the WAN simulator ARGS (rate 2, rate 0, cut, restore)."
  (apply #'call-process (getenv "GS_WANSIM") nil nil nil "--ctl" (getenv "GS_WANSIM_CTL") args))

(ert-deftest gpusync-test/a-large-save-reads-as-syncing-until-it-is-on-the-server ()
  (skip-unless gpusync-test--slow)
  (let ((default-directory gpusync-test--slow)
        (gpusync-notify-function #'gpusync-test--capture)
        (gpusync-test--notes nil)
        (file (expand-file-name "data.csv" gpusync-test--slow)))
    (gpusync-watch)
    (unwind-protect
        (progn
          (should (gpusync-test--wait 60 (lambda () (eq (gpusync--state) 'up-to-date))))
          (gpusync-test--wansim "rate" "2")
          ;; About 4 MB of hex (some 2 MB compressed) at 2 Mbit/s: several seconds on the link.
          (with-current-buffer (find-file-noselect file)
            (erase-buffer)
            (random "1")
            (dotimes (_ 40000)
              (dotimes (_ 12) (insert (format "%08x," (random 2147483647))))
              (insert "\n"))
            (save-buffer)
            (kill-buffer))
          (should (gpusync-test--wait 5 (lambda () (and (equal (gpusync-mode-line) " gpusync:syncing 1")
                                                         (not (file-exists-p (expand-file-name "data.csv" gpusync-test--slow-remote)))))))
          (gpusync-test--wansim "rate" "0")
          (should (gpusync-test--wait 60 (lambda () (and (file-exists-p (expand-file-name "data.csv" gpusync-test--slow-remote))
                                                          (equal (gpusync-mode-line) " gpusync:up to date"))))))
      (gpusync-test--wansim "rate" "0")
      (gpusync-stop-watching)
      (gpusync-test--wait 10 (lambda () (eq (gpusync--state) 'off)))
      (delete-file file))))

(ert-deftest gpusync-test/logs-tell-a-lost-connection-and-a-cli-error-from-a-run-that-ended ()
  (skip-unless (and gpusync-test--slow (not (equal (getenv "GS_EMACS_SKIP_RUN") "1"))))
  (let ((default-directory gpusync-test--slow)
        (gpusync-notify-function #'gpusync-test--capture)
        (gpusync-test--notes nil))
    ;; Before any run here, `logs -f' fails (exit 1): the CLI's error, not a run that ended.
    (unless (string-match-p "\"id\"" (shell-command-to-string (concat gpusync-executable " ps --json")))
      (gpusync-logs)
      (should (gpusync-test--wait 30 (lambda () (gpusync-test--noted "logs of run latest failed: no runs on the server yet\\'" :error))))
      (should-not (string-match-p "ended" (gpusync-test--buffer-text "*gpusync-logs latest*"))))
    (setq gpusync--last-run nil)
    (gpusync-run nil "cpu=1" '("sh" "-c" "echo tick; exec sleep 600"))
    (should (gpusync-test--wait 60 (lambda () gpusync--run-active)))
    (let* ((id gpusync--last-run) (name (format "*gpusync-logs %s*" id)))
      (unwind-protect
          (progn
            (should (gpusync-test--wait 30 (lambda () (string-match-p "tick" (gpusync-test--buffer-text name)))))
            (gpusync-test--wansim "cut")
            (gpusync-logs id)
            (should (gpusync-test--wait 30 (lambda () (string-match-p "lost the connection" (gpusync-test--buffer-text name)))))
            (should (gpusync-test--noted (regexp-quote (format "lost the connection to the run's logs (it may still be running; M-x gpusync-logs %s reattaches)" id))
                                         :warning))
            (should-not (string-match-p "ended" (gpusync-test--buffer-text name)))
            (should-not (gpusync-test--noted "ended with exit code"))
            (should gpusync--run-active)
            (should (string-match-p (regexp-quote (format "[run %s running]" id)) (gpusync-mode-line))))
        (gpusync-test--wansim "restore")
        (gpusync-stop-run id)
        (should (gpusync-test--wait 30 (lambda () (gpusync-test--noted (concat "stopped run " id) :info))))
        (setq gpusync--last-run nil gpusync--run-active nil)))))

(ert-deftest gpusync-test/each-project-shows-its-own-state ()
  ;; Two projects watched from one Emacs: each has its own event stream, and the lighter shows the
  ;; current buffer's project (the slow project's link is cut: it cannot be up to date).
  (skip-unless gpusync-test--slow)
  (let ((gpusync-notify-function #'gpusync-test--capture)
        (gpusync-test--notes nil)
        (a gpusync-test--project) (b gpusync-test--slow) a-proc)
    (gpusync-test--wansim "cut")
    (unwind-protect
        (progn
          (let ((default-directory a))
            (gpusync-watch)
            (should (gpusync-test--wait 60 (lambda () (eq (gpusync--state) 'up-to-date))))
            (setq a-proc (gpusync--project-process (gpusync--project))))
          (let ((default-directory b))
            (gpusync-watch)
            (should (gpusync-test--wait 30 (lambda () (process-live-p (gpusync--project-process (gpusync--project))))))
            (should-not (eq (gpusync--project-process (gpusync--project)) a-proc))
            (should (gpusync-test--wait 10 (lambda () (not (string-match-p "up to date" (gpusync-mode-line)))))))
          (let ((default-directory a))
            (should (equal (gpusync-mode-line) " gpusync:up to date")))
          (gpusync-test--wansim "restore")
          (let ((default-directory b))
            (with-temp-file (expand-file-name "two.txt" b) (insert "two\n"))
            (should (gpusync-test--wait 60 (lambda () (equal (gpusync-mode-line) " gpusync:up to date"))))
            (gpusync-stop-watching)
            (should (gpusync-test--wait 10 (lambda () (eq (gpusync--state) 'off)))))
          (let ((default-directory a))
            (should (eq (gpusync--project-process (gpusync--project)) a-proc))
            (should (eq (gpusync--state) 'up-to-date))))
      (gpusync-test--wansim "restore")
      (dolist (dir (list b a))
        (let ((default-directory dir))
          (when (process-live-p (gpusync--project-process (gpusync--project)))
            (gpusync-stop-watching)
            (gpusync-test--wait 10 (lambda () (eq (gpusync--state) 'off))))))
      ;; as in `gpusync-test--with-watch': let the daemons exit and release their locks
      (gpusync-test--wait 10 (lambda () (not (string-match-p "daemon\": *true"
                                                              (let ((default-directory a))
                                                                (shell-command-to-string (concat gpusync-executable " status --json"))))))))))

(ert-deftest gpusync-test/a-refused-first-login-reads-disconnected-with-the-reason ()
  ;; The daemon is started from a HOME without the key: it never connects, and the event stream
  ;; never says so.  The lighter must not stay "connecting".
  (let* ((default-directory gpusync-test--project)
         (gpusync-notify-function #'gpusync-test--capture)
         (gpusync-test--notes nil)
         (nokey (expand-file-name "nokey-emacs" (getenv "GS_WORK")))
         (home (getenv "HOME")))
    (make-directory (expand-file-name ".ssh" nokey) t)
    (copy-file (expand-file-name ".ssh/known_hosts" home) (expand-file-name ".ssh/known_hosts" nokey) t)
    (unwind-protect
        (progn
          (let ((process-environment (cons (concat "HOME=" nokey) process-environment)))
            (gpusync-watch)
            (should (gpusync-test--wait 30 (lambda () (process-live-p (gpusync--project-process (gpusync--project)))))))
          (should (gpusync-test--wait 10 (lambda () (eq (gpusync--state) 'disconnected))))
          (should (equal (gpusync-mode-line) " gpusync:disconnected"))
          (should (gpusync-test--wait 5 (lambda () (gpusync-test--noted "disconnected: authentication to" :warning)))))
      (gpusync-stop-watching)
      (gpusync-test--wait 10 (lambda () (eq (gpusync--state) 'off)))
      (gpusync-test--wait 10 (lambda () (not (string-match-p "daemon\": *true"
                                                              (shell-command-to-string (concat gpusync-executable " status --json")))))))))

;;;; A daemon that comes back

(defun gpusync-test--outside (dir &rest args)
  "Run gpusync ARGS in DIR as a shell would, outside the plugin; its last JSON object."
  (let ((default-directory dir))
    (with-temp-buffer
      (apply #'call-process gpusync-executable nil '(t nil) nil args)
      (gpusync--last-json (buffer-string)))))

(defun gpusync-test--pid-of (dir)
  "The pid of DIR's daemon, or nil when none runs."
  (let ((st (gpusync-test--outside dir "status" "--json")))
    (and (eq (alist-get 'daemon st) t) (alist-get 'pid st))))

(defun gpusync-test--gone (pid)
  "Wait until PID has exited (the daemon released its lock)."
  (gpusync-test--wait 10 (lambda () (not (process-attributes pid)))))

(defun gpusync-test--lighter-in (file)
  "The lighter as FILE's buffer shows it."
  (with-current-buffer (find-file-noselect file) (gpusync-mode-line)))

(defun gpusync-test--save-reported (file remote text)
  "Save TEXT as FILE; wait for REMOTE (its server copy) and a synced event after the save."
  (with-current-buffer (find-file-noselect file)
    (let ((p (gpusync--project)) (name (file-name-nondirectory file)))
      (setf (gpusync--project-events p) nil)
      (erase-buffer)
      (insert text)
      (save-buffer)
      (gpusync-test--wait 15 (lambda ()
                               (and (equal (gpusync-test--read remote) text)
                                    (seq-find (lambda (ev) (and (equal (alist-get 'event ev) "synced")
                                                                (equal (alist-get 'path ev) name)))
                                              (gpusync--project-events p))))))))

(ert-deftest gpusync-test/a-daemon-started-again-from-a-shell-is-followed ()
  ;; The stream ends (the daemon is killed, or stopped from a shell or with
  ;; `gpusync-stop-watching') and a daemon is started again from a shell: the lighter reads "off"
  ;; meanwhile, then follows the new daemon, and a save after that is reported.
  (let* ((default-directory gpusync-test--project)
         (gpusync-notify-function #'gpusync-test--capture)
         (gpusync-test--notes nil)
         (dir gpusync-test--project)
         (file (expand-file-name "again.txt" dir))
         (remote (expand-file-name "again.txt" gpusync-test--remote))
         (up (lambda () (string-prefix-p " gpusync:up to date" (gpusync-test--lighter-in file))))
         pid)
    (gpusync-watch)
    (unwind-protect
        (progn
          (should (gpusync-test--wait 60 up))
          (setq pid (gpusync-test--pid-of dir))
          (signal-process pid 'SIGKILL)
          (should (gpusync-test--wait 10 (lambda () (and (eq (gpusync--state) 'off)
                                                         (not (gpusync--project-process (gpusync--project)))))))
          (gpusync-test--gone pid)
          (should (alist-get 'pid (gpusync-test--outside dir "watch" "-d" "--json")))
          (should (gpusync-test--wait 15 up))
          (should (gpusync-test--save-reported file remote "after the kill\n"))

          (setq pid (gpusync-test--pid-of dir))
          (should (eq t (alist-get 'was_running (gpusync-test--outside dir "watch" "--stop" "--json"))))
          (should (gpusync-test--wait 10 (lambda () (eq (gpusync--state) 'off))))
          (gpusync-test--gone pid)
          (should (alist-get 'pid (gpusync-test--outside dir "watch" "-d" "--json")))
          (should (gpusync-test--wait 15 up))
          (should (gpusync-test--save-reported file remote "after the restart\n"))

          ;; The user's stop holds (nothing here starts a daemon again), but a daemon started
          ;; from a shell afterwards is followed, as any daemon of the project is.
          (setq pid (gpusync-test--pid-of dir))
          (gpusync-stop-watching)
          (should (gpusync-test--wait 10 (lambda () (gpusync-test--noted "stopped watching"))))
          (gpusync-test--gone pid)
          (should (eq (gpusync--state) 'off))
          (should-not (gpusync-test--pid-of dir))
          (should (alist-get 'pid (gpusync-test--outside dir "watch" "-d" "--json")))
          (should (gpusync-test--wait 15 up)))
      (setq pid (gpusync-test--pid-of dir))
      (gpusync-test--outside dir "watch" "--stop" "--json")
      (gpusync-test--wait 10 (lambda () (eq (gpusync--state) 'off)))
      (when pid (gpusync-test--gone pid))
      (when (get-file-buffer file) (kill-buffer (get-file-buffer file)))
      (delete-file file))))

(ert-deftest gpusync-test/a-daemon-started-from-a-shell-after-the-project-was-visited-is-followed ()
  ;; With `gpusync-mode' on, visiting a file of a project no daemon ran for yet, then starting its
  ;; daemon from a shell.
  (skip-unless gpusync-test--slow)
  (let* ((gpusync-notify-function #'gpusync-test--capture)
         (gpusync-test--notes nil)
         (dir gpusync-test--slow)
         (file (expand-file-name "late.txt" dir))
         pid)
    (gpusync-mode 1)
    (unwind-protect
        (progn
          (should (string-prefix-p " gpusync:off" (gpusync-test--lighter-in file)))
          (should (alist-get 'pid (gpusync-test--outside dir "watch" "-d" "--json")))
          (should (gpusync-test--wait 15 (lambda () (string-prefix-p " gpusync:up to date"
                                                                     (gpusync-test--lighter-in file)))))
          (should (gpusync-test--save-reported file (expand-file-name "late.txt" gpusync-test--slow-remote)
                                               "late\n")))
      (setq pid (gpusync-test--pid-of dir))
      (gpusync-test--outside dir "watch" "--stop" "--json")
      (when pid (gpusync-test--gone pid))
      (when (get-file-buffer file) (kill-buffer (get-file-buffer file)))
      (delete-file file))))

;;; gpusync-test.el ends here
