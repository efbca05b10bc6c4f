;;; gpusync.el --- Mirror a project to a GPU server and run jobs there, through the gpusync CLI -*- lexical-binding: t -*-

;; Version: 0.1
;; Package-Requires: ((emacs "27.1"))
;; Keywords: tools, processes
;; URL: https://github.com/gpusync/gpusync

;;; Commentary:

;; A thin front end: every command is one call to the `gpusync' CLI, whose --json output is the
;; contract, and the mode-line lighter is fed by `gpusync events --json' (a long-lived process).
;;
;;   M-x gpusync-watch           start `gpusync watch -d' and follow its events
;;   M-x gpusync-stop-watching   stop the daemon
;;   M-x gpusync-push            one-shot sync
;;   M-x gpusync-run             run a job (asks for the job and a GPU count) and follow its logs
;;   M-x gpusync-logs            follow a run's logs in *gpusync-logs RUN*
;;   M-x gpusync-stop-run        stop the run started here (or the one running)
;;   M-x gpusync-status          the daemon's state in the echo area
;;   M-x gpusync-doctor          the server checks in *gpusync-doctor*
;;   M-x gpusync-gpu             one sample of `gpusync top': a GPU summary in the mode line
;;
;; Conflicts and errors are reported with `display-warning' and name the file.
;;
;; While `gpusync-mode' is on (`gpusync-watch' turns it on; put (gpusync-mode 1) in your init file
;; to have it from the start), the watch daemon of every project visited is followed whenever one
;; runs: one started later from a shell (`gpusync watch -d'), and a new one after the daemon was
;; stopped, killed or crashed.  While none runs the lighter reads "off".  The mode never starts a
;; daemon, and looks for one without running anything: every 2 s it checks whether the project's
;; control socket (.gpusync/daemon.sock) is new; a socket a killed daemon left behind is tried
;; again once a minute.
;;
;; `gpusync-stop-watching' stops the daemon, and nothing here starts it again; a daemon that is
;; then started from a shell is followed like any other, so that the lighter says what syncs the
;; project rather than "off" while a daemon runs.

;;; Code:

(require 'cl-lib)
(require 'seq)
(require 'subr-x)

(defgroup gpusync nil
  "Mirror a project to a GPU server and run jobs there."
  :group 'tools
  :prefix "gpusync-")

(defcustom gpusync-executable (or (getenv "GPUSYNC_BIN") "gpusync")
  "The gpusync binary."
  :type 'string)

(defcustom gpusync-notify-function #'gpusync--notify-default
  "Called with (MESSAGE LEVEL) for every notification.
LEVEL is :info, :warning or :error."
  :type 'function)

;;;; State

(cl-defstruct (gpusync--project (:constructor gpusync--project-create (root)))
  "The sync state of one project: each project watched from this Emacs has its own
event stream, and the lighter shows the current buffer's project."
  root
  (state 'off :documentation "off, connecting, connected, syncing, up-to-date,
disconnected, conflict or error.")
  (count 0 :documentation "Files mirrored since the last idle event.")
  (batch nil :documentation "The last progress event of the batch under way, until idle.")
  (detail nil :documentation "The path or message behind a conflict, error or disconnection.")
  (events nil :documentation "The last 200 events, newest first (alists).")
  (failing nil :documentation "(PATH . MESSAGE) errors already notified: the daemon retries a
failed operation every few seconds, and each retry sends the error again.")
  (conflicts nil :documentation "Conflict copies kept on the server, not acknowledged yet
(alists with path and kept), from `status --json' and conflict events.")
  (process nil :documentation "The `gpusync events --json' process.")
  (looking nil :documentation "Whether this Emacs follows the project's daemon whenever one runs.")
  (tried nil :documentation "(SOCKET-ID . TIME): the control socket the last stream was
started on (`gpusync--socket-id'), and when (`float-time')."))

(defvar gpusync--projects (make-hash-table :test #'equal)
  "Project root -> its `gpusync--project'.")

(defun gpusync--project (&optional root)
  "The state of the project at ROOT (default: the current buffer's project)."
  (let ((root (or root (gpusync-root) "")))
    (or (gethash root gpusync--projects)
        (puthash root (gpusync--project-create root) gpusync--projects))))

(defun gpusync--state () "The current buffer's project's sync state." (gpusync--project-state (gpusync--project)))
(defvar gpusync--last-run nil "Id of the newest run started from this Emacs.")
(defvar gpusync--run-active nil "Whether `gpusync--last-run' is still followed.")
(defvar gpusync--stopping nil "Ids of the runs `gpusync-stop-run' asked to stop.")
(defvar gpusync--gpu nil "The server's one-line GPU summary from `gpusync-gpu', or nil.")

;;;; Helpers

(defun gpusync--notify-default (message level)
  "Show MESSAGE: the echo area for :info, a warning otherwise (LEVEL)."
  (if (eq level :info)
      (message "gpusync: %s" message)
    (display-warning 'gpusync message level)))

(defun gpusync--notify (level fmt &rest args)
  "Notify at LEVEL with (format FMT ARGS)."
  (funcall gpusync-notify-function (apply #'format fmt args) level))

(defun gpusync-root ()
  "The project directory at or above `default-directory', or nil.
It is the nearest folder that holds .gpusync/config."
  (when-let ((dir (locate-dominating-file default-directory ".gpusync/config")))
    (file-name-as-directory (expand-file-name dir))))

(defun gpusync--require-root ()
  "The project directory, or a user error."
  (or (gpusync-root)
      (user-error "gpusync: no .gpusync/config here or above; run `gpusync init user@host:port'")))

(defun gpusync--json (line)
  "LINE parsed as a JSON object (an alist), or nil."
  (condition-case nil
      (let ((obj (json-parse-string line :object-type 'alist :null-object nil
                                    :false-object :false :array-type 'list)))
        (and (listp obj) obj))
    (error nil)))

(defun gpusync--last-json (text)
  "The last line of TEXT that is a JSON object, parsed, or nil."
  (seq-some #'gpusync--json (reverse (split-string (or text "") "\n" t))))

(defun gpusync--failure (obj stderr)
  "What went wrong: OBJ's message, else STDERR."
  (or (alist-get 'message obj)
      (let ((s (string-trim (or stderr "")))) (and (not (string-empty-p s)) s))
      "failed"))

(defun gpusync--line-filter (on-line)
  "A process filter that calls ON-LINE with each complete line of output."
  (let ((partial ""))
    (lambda (_proc chunk)
      (let ((lines (split-string (concat partial chunk) "\n")))
        (setq partial (car (last lines)))
        (mapc on-line (butlast lines))))))

(defun gpusync--call (args callback &optional on-line)
  "Run gpusync ARGS in the project; call CALLBACK with (CODE STDOUT STDERR).
CALLBACK runs when the process exits.  ON-LINE, if given, sees each stdout
line as it comes.  Returns the process."
  (let* ((default-directory (gpusync--require-root))
         (out (generate-new-buffer " *gpusync-out*"))
         (err (generate-new-buffer " *gpusync-err*"))
         (errp (make-pipe-process :name "gpusync-stderr" :buffer err :noquery t))
         (collect (lambda (line)
                    (with-current-buffer out (goto-char (point-max)) (insert line "\n"))
                    (when on-line (funcall on-line line)))))
    (make-process
     :name "gpusync" :command (cons gpusync-executable args)
     :connection-type 'pipe :noquery t :stderr errp
     :filter (gpusync--line-filter collect)
     :sentinel (lambda (proc _event)
                 (unless (process-live-p proc)
                   ;; The exit can be seen before the last of stderr: drain it (bounded).
                   (let ((n 0))
                     (while (and (< n 20) (accept-process-output errp 0.01))
                       (setq n (1+ n))))
                   (delete-process errp)
                   (let ((o (with-current-buffer out (buffer-string)))
                         (e (with-current-buffer err (buffer-string))))
                     (kill-buffer out)
                     (kill-buffer err)
                     (funcall callback (process-exit-status proc) o e)))))))

;;;; The event stream and the mode line

(defun gpusync--syncing-label ()
  "\"syncing N\": the files of the batch.
Those sent so far, or the operations the daemon planned for it (progress),
so that one large file on its way reads \"syncing 1\"."
  (let* ((p (gpusync--project)) (total (alist-get 'ops_total (gpusync--project-batch p))))
    (format "syncing %d" (max (gpusync--project-count p) (if (numberp total) total 0)))))

(defun gpusync-mode-line ()
  "The lighter text, such as \" gpusync:syncing 3\"."
  (concat " gpusync:"
          (pcase (gpusync--state)
            ('syncing (gpusync--syncing-label))
            ('up-to-date "up to date")
            ((or 'conflict 'error)
             (format "%s %s" (gpusync--state)
                     (file-name-nondirectory (format "%s" (gpusync--project-detail (gpusync--project))))))
            (s (symbol-name s)))
          (let ((n (length (gpusync--project-conflicts (gpusync--project)))))
            (if (> n 0) (format " [%d conflict cop%s]" n (if (= n 1) "y" "ies")) ""))
          (if gpusync--last-run
              (format " [run %s %s]" gpusync--last-run (if gpusync--run-active "running" "ended"))
            "")
          (if gpusync--gpu (format " [%s]" gpusync--gpu) "")))

(defconst gpusync--reattach-seconds 2
  "Seconds between looks for the daemon of a known project not followed.
A look is a stat of the control socket, no process: a daemon that starts,
from here or from a shell, makes a new one.")

(defconst gpusync--stale-retry-seconds 60
  "How seldom a socket that did not answer (a killed daemon's) is tried again.")

(defvar gpusync--looker nil
  "The timer that looks after the known projects, while `gpusync-mode' is on.")

(define-minor-mode gpusync-mode
  "Show gpusync's sync state in the mode line (turned on by `gpusync-watch').
While it is on, the watch daemon of every project visited is followed whenever
one runs: one started later from a shell, and a new one after the daemon was
stopped, killed or crashed.  It never starts a daemon."
  :global t
  :lighter (:eval (gpusync-mode-line))
  (if gpusync-mode
      (progn
        (add-hook 'find-file-hook #'gpusync--look-here)
        (unless gpusync--looker
          (setq gpusync--looker (run-with-timer gpusync--reattach-seconds gpusync--reattach-seconds
                                                #'gpusync--look-all)))
        (gpusync--look-here))
    (remove-hook 'find-file-hook #'gpusync--look-here)
    (when gpusync--looker
      (cancel-timer gpusync--looker)
      (setq gpusync--looker nil))))

(defun gpusync--on-event (p ev)
  "Update the project P's state from the event EV (an alist)."
  (push ev (gpusync--project-events p))
  (when (> (length (gpusync--project-events p)) 200)
    (setcdr (nthcdr 199 (gpusync--project-events p)) nil))
  (let ((kind (alist-get 'event ev)) (path (alist-get 'path ev)))
    (pcase kind
      ((or "synced" "deleted" "renamed")
       (setf (gpusync--project-state p) 'syncing)
       (cl-incf (gpusync--project-count p))
       (setf (gpusync--project-failing p)
             (seq-remove (lambda (e) (member (car e) (list path (alist-get 'from ev))))
                         (gpusync--project-failing p))))
      ;; A batch longer than 250 ms says so every 250 ms: a large file on its way is syncing.
      ("progress" (setf (gpusync--project-state p) 'syncing (gpusync--project-batch p) ev))
      ("idle"
       (setf (gpusync--project-batch p) nil (gpusync--project-failing p) nil)
       (unless (and (memq (gpusync--project-state p) '(conflict error)) (= (gpusync--project-count p) 0))
         (setf (gpusync--project-state p) 'up-to-date (gpusync--project-detail p) nil))
       (setf (gpusync--project-count p) 0))
      ("connected" (setf (gpusync--project-state p) 'connected
                         (gpusync--project-detail p) (alist-get 'target ev)))
      ("disconnected"
       (setf (gpusync--project-state p) 'disconnected (gpusync--project-detail p) (alist-get 'message ev))
       (gpusync--notify :warning "disconnected: %s" (alist-get 'message ev)))
      ("conflict"
       (setf (gpusync--project-state p) 'conflict (gpusync--project-detail p) path
             (gpusync--project-count p) 0)
       (unless (seq-find (lambda (c) (equal (alist-get 'kept c) (alist-get 'kept ev)))
                         (gpusync--project-conflicts p))
         (setf (gpusync--project-conflicts p)
               (append (gpusync--project-conflicts p)
                       (list (list (cons 'path path) (cons 'kept (alist-get 'kept ev)))))))
       (gpusync--notify :warning "conflict on %s: the server had changed it; its copy is kept as %s"
                        path (alist-get 'kept ev)))
      ("error"
       (setf (gpusync--project-state p) 'error (gpusync--project-detail p) (or path (alist-get 'message ev))
             (gpusync--project-count p) 0)
       ;; Once per distinct error until it clears (the path syncs, or an idle says all is sent).
       (let ((key (cons path (alist-get 'message ev))))
         (unless (member key (gpusync--project-failing p))
           (push key (gpusync--project-failing p))
           (gpusync--notify :error "error%s: %s" (if path (concat " on " path) "")
                            (alist-get 'message ev)))))))
  (force-mode-line-update t))

(defun gpusync--reset (p)
  "Forget the project P's stream: its state reads off."
  (setf (gpusync--project-process p) nil (gpusync--project-state p) 'off
        (gpusync--project-count p) 0 (gpusync--project-batch p) nil)
  (force-mode-line-update t))

(defun gpusync--note-conflicts (p st)
  "Keep the conflict copies that the status reply ST lists as the project P's."
  (when (and st (assq 'conflicts st))
    (setf (gpusync--project-conflicts p) (alist-get 'conflicts st))
    (force-mode-line-update t)))

(defun gpusync--seed-state (p)
  "Set the project P's state from `gpusync status --json'.
Events only report changes."
  (let ((default-directory (gpusync--project-root p)))
    (gpusync--call '("status" "--json")
                   (lambda (code out _err)
                     (let ((st (gpusync--last-json out)))
                       (when (= code 0) (gpusync--note-conflicts p st))
                       ;; Only while a stream is followed: a reply that comes after it ended
                       ;; (the daemon was killed meanwhile) must not paint a live state over off.
                       (when (and st (eq (alist-get 'daemon st) t)
                                  (process-live-p (gpusync--project-process p))
                                  (memq (gpusync--project-state p) '(off connecting)))
                         (setf (gpusync--project-state p)
                               (intern (replace-regexp-in-string "_" "-" (alist-get 'state st)))
                               (gpusync--project-count p) (or (alist-get 'pending st) 0))
                         ;; A first connection that failed (a refused login) sends no event.
                         (when-let ((why (and (eq (gpusync--project-state p) 'disconnected)
                                              (stringp (alist-get 'last_error st))
                                              (alist-get 'last_error st))))
                           (setf (gpusync--project-detail p) why)
                           (gpusync--notify :warning "disconnected: %s" why))
                         (force-mode-line-update t)))))))

(defconst gpusync--connect-recheck-seconds 2
  "While connecting, how often `gpusync status --json' is read again.")

(defun gpusync--socket-id (root)
  "The identity of the project ROOT's control socket, or nil when there is none.
A daemon that starts binds a new socket (it unlinks the one a killed daemon
left), so a new inode or mtime means a daemon to follow."
  (let ((attrs (file-attributes (expand-file-name ".gpusync/daemon.sock" root))))
    (and attrs (string-prefix-p "s" (file-attribute-modes attrs))
         (format "%S:%S" (file-attribute-inode-number attrs) (file-attribute-modification-time attrs)))))

(defun gpusync-follow-events (&optional root quiet)
  "Follow the event stream of the daemon of the project at ROOT, once.
ROOT defaults to the current buffer's project, which is looked after from then
on (`gpusync--look-after').  QUIET: a look for a daemon that may not be there
\(a socket a killed one left): the state stays off until `status --json' says
that a daemon runs."
  (let* ((root (or root (gpusync--require-root))) (p (gpusync--project root)))
    (unless (process-live-p (gpusync--project-process p))
      (let ((default-directory root))
        (setf (gpusync--project-tried p) (cons (gpusync--socket-id root) (float-time))
              (gpusync--project-failing p) nil
              (gpusync--project-process p)
              (make-process
               :name "gpusync-events" :command (list gpusync-executable "events" "--json")
               :connection-type 'pipe :noquery t
               :stderr (get-buffer-create " *gpusync-events-stderr*")
               :filter (gpusync--line-filter
                        (lambda (line) (when-let ((ev (gpusync--json line))) (gpusync--on-event p ev))))
               :sentinel (lambda (proc _event)
                           (unless (or (process-live-p proc) (not (eq proc (gpusync--project-process p))))
                             (gpusync--reset p)))))
        (unless quiet (setf (gpusync--project-state p) 'connecting))
        (gpusync--look-after root)
        (gpusync-mode 1)
        (gpusync--seed-state p)
        ;; The stream says "connected" once the session is up, but nothing when the first
        ;; attempt fails (a wrong password, no key accepted): while connecting, ask status again.
        (let ((proc (gpusync--project-process p)) timer)
          (setq timer (run-with-timer
                       gpusync--connect-recheck-seconds gpusync--connect-recheck-seconds
                       (lambda ()
                         (if (and (eq proc (gpusync--project-process p)) (process-live-p proc)
                                  (memq (gpusync--project-state p) '(off connecting)))
                             (gpusync--seed-state p)
                           (cancel-timer timer))))))))))

(defun gpusync--look-once (p)
  "Follow the project P's daemon if one runs and is not followed yet.
That is, its control socket is new, or the one that did not answer was tried
long enough ago."
  (unless (process-live-p (gpusync--project-process p))
    (let ((id (gpusync--socket-id (gpusync--project-root p))) (tried (gpusync--project-tried p)))
      (when (and id (or (not (equal id (car tried)))
                        (>= (- (float-time) (or (cdr tried) 0)) gpusync--stale-retry-seconds)))
        (with-demoted-errors "gpusync: %S"
          (gpusync-follow-events (gpusync--project-root p) t))))))

(defun gpusync--look-all ()
  "Look for the daemon of each project looked after (the timer `gpusync--looker')."
  (maphash (lambda (_root p) (when (gpusync--project-looking p) (gpusync--look-once p)))
           gpusync--projects))

(defun gpusync--look-after (root)
  "Follow the daemon of the project at ROOT whenever one runs, from now on.
Once it is started (from here or from a shell) and again after its stream
ended (the daemon was stopped, killed or crashed, and maybe started again):
the timer `gpusync--looker' looks every `gpusync--reattach-seconds' while
`gpusync-mode' is on.  Never starts a daemon.  Looks at once."
  (let ((p (gpusync--project root)))
    (unless (gpusync--project-looking p)
      (setf (gpusync--project-looking p) t)
      (gpusync--look-once p))))

(defun gpusync--look-here ()
  "Look after the current buffer's project, if any.
In `find-file-hook' while `gpusync-mode' is on."
  (when-let ((root (gpusync-root)))
    (gpusync--look-after root)))

;;;; Commands

;;;###autoload
(defun gpusync-watch ()
  "Start `gpusync watch -d' for this project and show its state in the mode line."
  (interactive)
  (let ((root (gpusync--require-root)))
    (gpusync--call '("watch" "-d" "--json")
                   (lambda (code out err)
                     (let ((r (gpusync--last-json out)))
                       (cond ((= code 0)
                              (gpusync--notify :info "watching (daemon pid %s)" (alist-get 'pid r))
                              (gpusync-follow-events root))
                             ((string-match-p "already running" (gpusync--failure r err))
                              (gpusync--notify :info "already watching this project")
                              (gpusync-follow-events root))
                             (t (gpusync--notify :error "watch failed: %s" (gpusync--failure r err)))))))))

(defun gpusync--stopped-message (reply)
  "What `watch --stop --json' answered (REPLY), for the user.
\"stopped\" alone reads as \"and every change was sent\", which is not so
when the daemon was stopped in the middle of an upload."
  (let ((unsent (or (alist-get 'unsent reply) 0)))
    (cond ((not (eq (alist-get 'was_running reply) t)) "no watch was running")
          ((> unsent 0)
           (format "stopped watching; %d change%s not sent (M-x gpusync-push sends %s)"
                   unsent (if (= unsent 1) " was" "s were") (if (= unsent 1) "it" "them")))
          ((eq (alist-get 'unchecked reply) t)
           "stopped watching before every file was checked (M-x gpusync-push checks them)")
          (t "stopped watching"))))

;;;###autoload
(defun gpusync-stop-watching ()
  "Stop this project's gpusync daemon."
  (interactive)
  (let ((p (gpusync--project (gpusync--require-root))))
    (gpusync--call '("watch" "--stop" "--json")
                   (lambda (code out err)
                     (let ((reply (gpusync--last-json out)))
                       (if (/= code 0)
                           (gpusync--notify :error "stop failed: %s" (gpusync--failure reply err))
                         (when (process-live-p (gpusync--project-process p))
                           (delete-process (gpusync--project-process p)))
                         (gpusync--reset p)
                         (gpusync--notify (if (> (or (alist-get 'unsent reply) 0) 0) :warning :info)
                                          "%s" (gpusync--stopped-message reply))))))))

;;;###autoload
(defun gpusync-push ()
  "Make the server match the project now (`gpusync push')."
  (interactive)
  (gpusync--notify :info "pushing...")
  (gpusync--call
   '("push" "--json")
   (lambda (code out err)
     (let ((r (gpusync--last-json out)))
       (when (or (null r) (/= code 0) (eq (alist-get 'ok r) :false))
         (gpusync--notify :error "push failed: %s" (gpusync--failure r err)))
       (when (alist-get 'sent r)
         (dolist (c (alist-get 'conflicts r))
           (gpusync--notify :warning "conflict on %s: the server copy is kept as %s"
                            (alist-get 'path c) (alist-get 'kept c)))
         (dolist (f (alist-get 'failures r))
           (gpusync--notify :error "%s %s failed: %s" (alist-get 'op f) (alist-get 'path f)
                            (alist-get 'message f)))
         (gpusync--notify :info "pushed: sent %d, deleted %d, renamed %d, unchanged %d in %.2f s"
                          (alist-get 'sent r) (alist-get 'deleted r) (alist-get 'renamed r)
                          (alist-get 'unchanged r) (alist-get 'seconds r)))))))

;;;###autoload
(defun gpusync-status ()
  "Show the daemon's state (or what a push would do) in the echo area."
  (interactive)
  (let ((p (gpusync--project (gpusync--require-root))))
    (gpusync--call
     '("status" "--json")
     (lambda (code out err)
       (let* ((st (gpusync--last-json out))
              (copies (gpusync--conflicts-text (alist-get 'conflicts st)))
              (level (if (string-empty-p copies) :info :warning)))
         (when (= code 0) (gpusync--note-conflicts p st))
         (cond ((or (/= code 0) (null st))
                (gpusync--notify :error "status failed: %s" (gpusync--failure st err)))
               ((eq (alist-get 'daemon st) t)
                (gpusync--notify level "%s, %s, %d pending%s%s" (alist-get 'state st)
                                 (if (eq (alist-get 'connected st) t) "connected" "not connected")
                                 (alist-get 'pending st)
                                 (if-let ((e (alist-get 'last_error st))) (concat ", last error: " e) "")
                                 copies))
               (t (gpusync--notify level "not watching; %s, %d change(s) to push%s"
                                   (alist-get 'state st) (alist-get 'pending st) copies))))))))

(defun gpusync--conflicts-text (list)
  "The conflict copies LIST (from `status --json'), for `gpusync-status'.
\"\" when there is none."
  (if (null list)
      ""
    (format "\n%d conflict cop%s kept on the server (gpusync status --ack clears): %s"
            (length list) (if (= (length list) 1) "y" "ies")
            (mapconcat (lambda (c) (format "%s (the server's copy is %s)"
                                           (alist-get 'path c) (alist-get 'kept c)))
                       list ", "))))

;;;; Logs

(define-derived-mode gpusync-log-mode special-mode "gpusync-log"
  "A read-only buffer that follows a gpusync run's logs.")

(defun gpusync--append (buffer text)
  "Append TEXT to BUFFER, keeping the windows that show it at its end."
  (when (buffer-live-p buffer)
    (with-current-buffer buffer
      (let ((inhibit-read-only t))
        (save-excursion (goto-char (point-max)) (insert text))))
    (dolist (win (get-buffer-window-list buffer nil t))
      (set-window-point win (with-current-buffer buffer (point-max))))))

(defun gpusync--special-buffer (name)
  "A fresh, empty `gpusync-log-mode' buffer called NAME."
  (let ((buf (get-buffer-create name)))
    (with-current-buffer buf
      (let ((inhibit-read-only t)) (erase-buffer))
      (unless (derived-mode-p 'gpusync-log-mode) (gpusync-log-mode)))
    buf))

;; A follower process carries `gpusync-run' (its run id, or nil for the newest) and
;; `gpusync-stderr' (the buffer of its stderr).
(defun gpusync--logs-say-ended (proc code)
  "Note in PROC's buffer that its run ended with CODE, and tell the user."
  (let ((run (process-get proc 'gpusync-run)))
    (gpusync--append (process-buffer proc)
                     (format "[gpusync: run %s ended: exit %d]\n" (or run "latest") code))
    (when (equal run gpusync--last-run)
      (setq gpusync--run-active nil)
      (force-mode-line-update t))
    (cond ((= code 0))
          ((member run gpusync--stopping)
           (gpusync--notify :warning "run %s was stopped (exit code %d)" run code))
          (t (gpusync--notify (if (= code 130) :warning :error) "run %s ended with exit code %d"
                              (or run "(latest)") code)))))

(defun gpusync--logs-ended (proc _event)
  "Sentinel of a `gpusync logs -f' process PROC: note how it ended in its buffer.
The run's status when the run ended; 255 when the connection failed (the run
may go on); anything else is the CLI's own failure (no such run, no runs
yet), told apart from a failed run by asking `ps --json' whether it ended."
  (unless (process-live-p proc)
    ;; The exit can be seen before the last of stderr: drain it (bounded), as `gpusync--call' does.
    (when-let ((errp (process-get proc 'gpusync-stderr-proc)))
      (let ((n 0))
        (while (and (< n 20) (accept-process-output errp 0.01))
          (setq n (1+ n))))
      (delete-process errp))
    (let* ((code (process-exit-status proc)) (run (process-get proc 'gpusync-run))
           (label (or run "latest")) (errbuf (process-get proc 'gpusync-stderr))
           (why (and (buffer-live-p errbuf)
                     (string-trim (replace-regexp-in-string
                                   "^gpusync: " "" (with-current-buffer errbuf (buffer-string)))))))
      (when (buffer-live-p errbuf) (kill-buffer errbuf))
      (when (or (null why) (string-empty-p why)) (setq why (format "exit %d" code)))
      (cond
       ((= code 0) (gpusync--logs-say-ended proc code))
       ((= code 255)
        (let ((msg (format "lost the connection to the run's logs (it may still be running; M-x gpusync-logs %sreattaches)"
                           (if run (concat run " ") ""))))
          (gpusync--append (process-buffer proc) (format "[gpusync: %s]\n" msg))
          (gpusync--notify :warning "run %s: %s" label msg)))
       (t
        (let ((default-directory (or (with-current-buffer (process-buffer proc) default-directory)
                                     default-directory)))
          (gpusync--call
           '("ps" "--json")
           (lambda (pcode out _err)
             (let* ((r (and (= pcode 0) (gpusync--last-json out)))
                    (runs (alist-get 'runs r))
                    (it (if run (seq-find (lambda (x) (equal (alist-get 'id x) run)) runs) (car runs))))
               (if (and it (not (equal (alist-get 'state it) "running")))
                   (gpusync--logs-say-ended proc code)
                 (gpusync--append (process-buffer proc)
                                  (format "[gpusync: logs of run %s failed: %s]\n" label why))
                 (gpusync--notify :error "logs of run %s failed: %s" label why)))))))))))

;;;###autoload
(defun gpusync-logs (&optional run)
  "Follow RUN's logs (the newest run by default) in *gpusync-logs RUN*.
Returns the buffer."
  (interactive (list (let ((s (read-string "Run (empty: newest): "))) (and (not (string-empty-p s)) s))))
  (let* ((root (gpusync--require-root))
         (name (format "*gpusync-logs %s*" (or run "latest")))
         (old (and (get-buffer name) (get-buffer-process name))))
    ;; A follower already on this buffer is replaced: silence it first, so its end neither writes
    ;; into the fresh buffer nor reports the run as ended.
    (when old
      (set-process-sentinel old #'ignore)
      (set-process-filter old #'ignore)
      (when-let ((errp (process-get old 'gpusync-stderr-proc))) (delete-process errp))
      (when-let ((errbuf (process-get old 'gpusync-stderr))) (kill-buffer errbuf))
      (delete-process old))
    (let* ((buf (gpusync--special-buffer name))
           (errbuf (generate-new-buffer " *gpusync-logs-err*"))
           (proc (progn
                   (with-current-buffer buf (setq default-directory root))
                   (make-process
                    :name "gpusync-logs" :buffer buf :noquery t :connection-type 'pipe
                    :command (append (list gpusync-executable "logs" "-f") (and run (list run)))
                    :stderr (make-pipe-process
                             :name "gpusync-logs-stderr" :buffer errbuf :noquery t
                             :sentinel #'ignore
                             :filter (lambda (p text)
                                       (when (buffer-live-p (process-buffer p))
                                         (with-current-buffer (process-buffer p)
                                           (goto-char (point-max)) (insert text)))
                                       (gpusync--append buf text)))
                    :filter (lambda (proc text) (gpusync--append (process-buffer proc) text))
                    :sentinel #'gpusync--logs-ended))))
      (process-put proc 'gpusync-run run)
      (process-put proc 'gpusync-stderr errbuf)
      (process-put proc 'gpusync-stderr-proc (get-buffer-process errbuf))
      (display-buffer buf)
      buf)))

;;;; Runs

(defun gpusync-jobs ()
  "The [job \"NAME\"] names of .gpusync/config, and the bundled trainer \"train\"."
  (let ((file (expand-file-name ".gpusync/config" (gpusync--require-root))) names)
    (with-temp-buffer
      (insert-file-contents file)
      (while (re-search-forward "^[ \t]*\\[job[ \t]+\"\\([^\"]+\\)\"\\]" nil t)
        (push (match-string 1) names)))
    (delete-dups (append (nreverse names) '("train")))))

(defun gpusync--gpu-flags (gpus)
  "CLI flags for GPUS.
GPUS is \"2\" or \"0,2\" (GPUs), \"cpu=2\" (CPU ranks), or nil or \"\" (the
job's own)."
  (cond ((or (null gpus) (string-empty-p gpus)) nil)
        ((string-match "\\`cpu[:=]?\\([0-9]+\\)\\'" gpus) (list "--cpu" (match-string 1 gpus)))
        ((string-match-p "\\`[0-9,]+\\'" gpus) (list "--gpus" gpus))
        (t (user-error "gpusync: GPUs must be N, a list such as 0,2, or cpu=N; not %s" gpus))))

;;;###autoload
(defun gpusync-run (job &optional gpus command)
  "Start JOB (a config job, or \"train\") on GPUS and follow its logs.
GPUS: \"2\", \"0,2\", \"cpu=2\", or nil for the job's own.  With JOB nil,
run COMMAND, a list of words (for example (\"sh\" \"-c\" \"echo $RANK\")).
When JOB is given, COMMAND holds extra arguments for it.  Interactively,
asks for the job and the GPUs."
  (interactive (list (completing-read "Run job: " (gpusync-jobs) nil nil)
                     (read-string "GPUs (N, 0,2, cpu=N; empty: the job's): ")))
  (let ((args (append '("run" "--detach" "--json") (gpusync--gpu-flags gpus)
                      (and job (not (string-empty-p job)) (list job))
                      (and command (cons "--" command)))))
    (gpusync--notify :info "starting %s..." (or job (string-join command " ")))
    (gpusync--call
     args
     (lambda (code out err)
       (let ((r (gpusync--last-json out)))
         (if (or (/= code 0) (null r) (not (eq (alist-get 'ok r) t)))
             (gpusync--notify :error "run failed: %s" (gpusync--failure r err))
           (setq gpusync--last-run (alist-get 'id r) gpusync--run-active t)
           (force-mode-line-update t)
           (gpusync--notify :info "run %s started: %d rank(s), MASTER_PORT %s"
                            (alist-get 'id r) (alist-get 'ranks r) (alist-get 'master_port r))
           (gpusync-logs (alist-get 'id r))))))))

(defun gpusync--stop-id (id)
  "Stop the run ID."
  (push id gpusync--stopping)
  (gpusync--call (list "stop" id "--json")
                 (lambda (code out err)
                   (let ((r (gpusync--last-json out)))
                     (if (and (= code 0) r (eq (alist-get 'ok r) t))
                         (gpusync--notify :info "stopped run %s" (alist-get 'id r))
                       (gpusync--notify :error "stop %s failed: %s" id (gpusync--failure r err)))))))

;;;###autoload
(defun gpusync-stop-run (&optional run)
  "Stop RUN; by default the run started here, else the one running.
Asks which one when several are running."
  (interactive)
  (let ((id (or run (and gpusync--run-active gpusync--last-run))))
    (if id
        (gpusync--stop-id id)
      (gpusync--call
       '("ps" "--json")
       (lambda (code out err)
         (let* ((r (gpusync--last-json out))
                (running (delq nil (mapcar (lambda (x) (and (equal (alist-get 'state x) "running")
                                                            (alist-get 'id x)))
                                           (alist-get 'runs r)))))
           (cond ((or (/= code 0) (null r))
                  (gpusync--notify :error "ps failed: %s" (gpusync--failure r err)))
                 ((null running) (gpusync--notify :warning "no run is running"))
                 ((null (cdr running)) (gpusync--stop-id (car running)))
                 (t (gpusync--stop-id (completing-read "Stop run: " running nil t))))))))))

;;;###autoload
(defun gpusync-doctor ()
  "Check the server (`gpusync doctor') and list the results in *gpusync-doctor*."
  (interactive)
  (gpusync--notify :info "checking...")
  (gpusync--call
   '("doctor" "--json")
   (lambda (code out err)
     (let ((r (gpusync--last-json out)) (bad 0))
       (if (not (alist-get 'checks r))
           (gpusync--notify :error "doctor failed: %s" (gpusync--failure r err))
         (let ((buf (gpusync--special-buffer "*gpusync-doctor*")))
           (dolist (c (alist-get 'checks r))
             (unless (equal (alist-get 'status c) "ok") (setq bad (1+ bad)))
             (gpusync--append buf (format "[%-4s] %-10s %s%s\n" (alist-get 'status c) (alist-get 'name c)
                                          (or (alist-get 'detail c) "")
                                          (if-let ((h (alist-get 'hint c))) (concat "  -> " h) ""))))
           (display-buffer buf)
           (gpusync--notify (if (and (= code 0) (= bad 0)) :info :warning)
                            "doctor: %d check(s), %d not ok" (length (alist-get 'checks r)) bad)))))))

;;;###autoload
(defun gpusync-gpu ()
  "Show the server's GPUs (one sample of `gpusync top') in the echo area and the mode line,
such as \"GPU0 87% 31.2/79.6 GiB 250 W 64°C | GPU1 ...\"."
  (interactive)
  (gpusync--call
   '("top" "--json" "--count" "1")
   (lambda (code out err)
     (let* ((r (gpusync--last-json out)) (summary (alist-get 'gpu_summary r)))
       (if (or (/= code 0) (not (stringp summary)))
           (gpusync--notify :error "gpu: %s" (gpusync--failure r err))
         (setq gpusync--gpu summary)
         (gpusync-mode 1)
         (force-mode-line-update t)
         (gpusync--notify :info "%s%s" summary
                          (if-let ((why (alist-get 'gpu_error r))) (concat ": " why) "")))))))

(provide 'gpusync)
;;; gpusync.el ends here
